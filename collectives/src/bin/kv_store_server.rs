//! Standalone key-value store server for multi-process / multi-node
//! bootstrap: `kv_store_server [ADDR]` (default 127.0.0.1:29400) binds ADDR,
//! prints the bound address on stdout, and serves until killed.
//!
//! Invariant: exits non-zero with a message (no panic) when the address is
//! bad or cannot be bound.

use collectives::TcpStoreServer;
use std::io::Write;

fn main() {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:29400".to_string());
    match TcpStoreServer::bind(addr.as_str()) {
        Ok(server) => {
            println!("{}", server.local_addr());
            let _ = std::io::stdout().flush();
            server.wait();
        }
        Err(e) => {
            eprintln!("kv_store_server: cannot serve on {addr}: {e}");
            std::process::exit(1);
        }
    }
}
