//! Multi-process bootstrap (the path NCCL's bootstrap takes): N processes on
//! this host rendezvous through a key-value store knowing only its address
//! and the world size, and every process obtains the same unique id and a
//! distinct rank.
//!
//! The processes are this test binary itself, re-run with `mp_child --exact`
//! and the `COLLECTIVES_MP_*` environment variables; without them `mp_child`
//! does nothing. Stores: a TCP server in the parent, a TCP server hosted by
//! the rank-0 process, the standalone `kv_store_server` binary, and a
//! directory (file store). A world with a missing process must fail on every
//! process with an error naming the missing rank.

use collectives::bootstrap::{barrier, rendezvous, UniqueId};
use collectives::{FileStore, KeyValueStore, TcpStore, TcpStoreServer};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const STORE: &str = "COLLECTIVES_MP_STORE";
const WORLD: &str = "COLLECTIVES_MP_WORLD";
const RANK: &str = "COLLECTIVES_MP_RANK";
const HOST: &str = "COLLECTIVES_MP_HOST";
const TIMEOUT_MS: &str = "COLLECTIVES_MP_TIMEOUT_MS";

/// The child process: bootstrap, print `MP_RESULT rank=<r> id=<hex>` or
/// `MP_ERROR <message>`.
#[test]
fn mp_child() {
    let Ok(store_spec) = std::env::var(STORE) else {
        return; // not a child
    };
    let world: usize = std::env::var(WORLD).unwrap().parse().unwrap();
    let rank: Option<usize> = std::env::var(RANK).ok().map(|r| r.parse().unwrap());
    let timeout = Duration::from_millis(
        std::env::var(TIMEOUT_MS)
            .ok()
            .and_then(|t| t.parse().ok())
            .unwrap_or(30_000),
    );
    let host = std::env::var(HOST).is_ok();
    let result = (|| -> collectives::Result<(usize, UniqueId)> {
        let mut _server = None;
        let store: Box<dyn KeyValueStore> = if let Some(addr) = store_spec.strip_prefix("tcp:") {
            if host {
                _server = Some(TcpStoreServer::bind(addr)?);
            }
            Box::new(TcpStore::connect(addr, timeout)?)
        } else if let Some(dir) = store_spec.strip_prefix("file:") {
            Box::new(FileStore::new(dir)?)
        } else {
            panic!("bad store spec {store_spec}");
        };
        let info = rendezvous(store.as_ref(), "mp-test", rank, world, timeout, || {
            Ok(UniqueId::random())
        })?;
        // The host must outlive every other process's requests: the others
        // say they are leaving (their last request), the host waits for it.
        barrier(store.as_ref(), "mp-test", "done", info.rank, world, timeout)?;
        if info.rank == 0 {
            for r in 1..world {
                store.get(&format!("mp-test/left/{r}"), timeout)?;
            }
        } else {
            let _ = store.set(&format!("mp-test/left/{}", info.rank), b"1");
        }
        Ok((info.rank, info.unique_id))
    })();
    match result {
        Ok((rank, id)) => println!("MP_RESULT rank={rank} id={}", id.to_hex()),
        Err(e) => println!("MP_ERROR {e}"),
    }
}

fn spawn_child(envs: &[(&str, String)]) -> Child {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = Command::new(exe);
    cmd.args(["mp_child", "--exact", "--nocapture", "--test-threads=1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn child test process")
}

/// Waits for every child (killing all after `limit`) and returns the
/// `MP_` line each printed.
fn collect(children: Vec<Child>, limit: Duration) -> Vec<String> {
    let deadline = Instant::now() + limit;
    let mut out = Vec::new();
    for mut c in children {
        loop {
            match c.try_wait().unwrap() {
                Some(_) => break,
                None if Instant::now() > deadline => {
                    let _ = c.kill();
                    let _ = c.wait();
                    panic!("child process hung");
                }
                None => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        let line = BufReader::new(c.stdout.take().unwrap())
            .lines()
            .map_while(Result::ok)
            // The harness may print "test mp_child ... " before it.
            .find_map(|l| l.find("MP_").map(|i| l[i..].to_string()))
            .unwrap_or_else(|| "MP_ERROR child printed nothing".into());
        out.push(line);
    }
    out
}

/// Every process got a distinct rank in 0..n and the same id.
fn check_results(lines: &[String], n: usize) {
    let mut ranks = Vec::new();
    let mut ids = Vec::new();
    for l in lines {
        let rest = l
            .strip_prefix("MP_RESULT rank=")
            .unwrap_or_else(|| panic!("child failed: {l}"));
        let (r, id) = rest.split_once(" id=").unwrap();
        ranks.push(r.parse::<usize>().unwrap());
        ids.push(id.to_string());
    }
    ranks.sort();
    assert_eq!(ranks, (0..n).collect::<Vec<_>>(), "{lines:?}");
    assert_eq!(ids[0].len(), 256);
    assert!(ids.iter().all(|i| i == &ids[0]), "ids differ: {lines:?}");
}

fn free_loopback_port() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

#[test]
fn processes_rendezvous_through_tcp_store_in_parent() {
    let server = TcpStoreServer::bind("127.0.0.1:0").unwrap();
    let n = 4;
    let children: Vec<Child> = (0..n)
        .map(|_| {
            spawn_child(&[
                (STORE, format!("tcp:{}", server.local_addr())),
                (WORLD, n.to_string()),
            ])
        })
        .collect();
    check_results(&collect(children, Duration::from_secs(120)), n);
}

#[test]
fn rank0_process_hosts_the_tcp_store() {
    let addr = free_loopback_port();
    let n = 3;
    // Start the clients first: they retry until rank 0's server is up.
    let children: Vec<Child> = (0..n)
        .rev()
        .map(|r| {
            let mut env = vec![
                (STORE, format!("tcp:{addr}")),
                (WORLD, n.to_string()),
                (RANK, r.to_string()),
            ];
            if r == 0 {
                env.push((HOST, "1".into()));
            }
            spawn_child(&env)
        })
        .collect();
    check_results(&collect(children, Duration::from_secs(120)), n);
}

#[test]
fn standalone_store_server_process() {
    let mut server = Command::new(env!("CARGO_BIN_EXE_kv_store_server"))
        .arg("127.0.0.1:0")
        .stdout(Stdio::piped())
        .spawn()
        .expect("start kv_store_server");
    let mut first = String::new();
    BufReader::new(server.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let addr = first.trim().to_string();
    let n = 3;
    let children: Vec<Child> = (0..n)
        .map(|_| spawn_child(&[(STORE, format!("tcp:{addr}")), (WORLD, n.to_string())]))
        .collect();
    let lines = collect(children, Duration::from_secs(120));
    let _ = server.kill();
    let _ = server.wait();
    check_results(&lines, n);
}

#[test]
fn processes_rendezvous_through_file_store() {
    let dir = std::env::temp_dir().join(format!(
        "collectives-mp-{}-{}",
        std::process::id(),
        Instant::now().elapsed().as_nanos()
    ));
    let n = 3;
    let children: Vec<Child> = (0..n)
        .map(|_| {
            spawn_child(&[
                (STORE, format!("file:{}", dir.display())),
                (WORLD, n.to_string()),
            ])
        })
        .collect();
    let lines = collect(children, Duration::from_secs(120));
    let _ = std::fs::remove_dir_all(&dir);
    check_results(&lines, n);
}

#[test]
fn missing_process_fails_every_process_naming_it() {
    let server = TcpStoreServer::bind("127.0.0.1:0").unwrap();
    // World of 3, only ranks 0 and 1 start.
    let children: Vec<Child> = (0..2)
        .map(|r| {
            spawn_child(&[
                (STORE, format!("tcp:{}", server.local_addr())),
                (WORLD, "3".into()),
                (RANK, r.to_string()),
                (TIMEOUT_MS, "1500".into()),
            ])
        })
        .collect();
    let start = Instant::now();
    let lines = collect(children, Duration::from_secs(60));
    for l in &lines {
        assert!(l.starts_with("MP_ERROR"), "{l}");
        assert!(l.contains("[2]"), "error does not name rank 2: {l}");
    }
    assert!(start.elapsed() < Duration::from_secs(30));
}
