//! Key-value stores for bootstrap: the side channel through which ranks
//! exchange a communicator's unique id (XLA's `KeyValueStoreInterface`,
//! PyTorch's `TCPStore`/`FileStore`).
//!
//! Three implementations of [`KeyValueStore`]:
//! * [`InMemoryStore`]: threads of one process;
//! * [`FileStore`]: processes sharing a directory (atomic rename; counters
//!   under a lock file);
//! * [`TcpStore`]: a client of a [`TcpStoreServer`] (std::net only), hosted by
//!   rank 0 or by a standalone process (`kv_store_server` binary).
//!
//! TCP protocol, one request line and one reply line, keys and values hex
//! encoded (so any bytes are allowed):
//! ```text
//! SET <key> <value>       -> OK
//! GET <key> <timeout_ms>  -> VAL <value> | TIMEOUT      (waits for the key)
//! TRY <key>               -> VAL <value> | NONE
//! ADD <key> <delta>       -> NUM <new value>            (missing counts as 0)
//! PING                    -> PONG
//! anything else           -> ERR <message>
//! ```
//!
//! Invariants: every wait is bounded by the caller's timeout; a store never
//! panics on bad input (malformed lines get `ERR`, oversized lines close the
//! connection); values set are immutable only by convention (a second `SET`
//! overwrites).

use crate::error::StoreError;
use std::collections::HashMap;
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

type StoreResult<T> = std::result::Result<T, StoreError>;

/// A key-value store shared by the ranks of one job.
pub trait KeyValueStore: Send + Sync {
    /// Sets `key` to `value`.
    fn set(&self, key: &str, value: &[u8]) -> StoreResult<()>;
    /// The value of `key`, waiting up to `timeout` for it to be set.
    fn get(&self, key: &str, timeout: Duration) -> StoreResult<Vec<u8>>;
    /// The value of `key` if it is set.
    fn try_get(&self, key: &str) -> StoreResult<Option<Vec<u8>>>;
    /// Atomically adds `delta` to the decimal counter at `key` (missing is
    /// 0) and returns the new value.
    fn add(&self, key: &str, delta: i64) -> StoreResult<i64>;
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn parse_counter(key: &str, v: &[u8]) -> StoreResult<i64> {
    std::str::from_utf8(v)
        .ok()
        .and_then(|s| s.trim().parse::<i64>().ok())
        .ok_or_else(|| StoreError::Protocol(format!("value of {key:?} is not a counter")))
}

fn add_counter(key: &str, old: Option<&[u8]>, delta: i64) -> StoreResult<i64> {
    let cur = match old {
        Some(v) => parse_counter(key, v)?,
        None => 0,
    };
    cur.checked_add(delta)
        .ok_or_else(|| StoreError::InvalidArgument(format!("counter {key:?} overflows")))
}

// ---------------------------------------------------------------------------
// In-memory

#[derive(Default)]
struct MemInner {
    map: Mutex<HashMap<String, Vec<u8>>>,
    cv: Condvar,
}

impl MemInner {
    fn set(&self, key: &str, value: &[u8]) {
        lock(&self.map).insert(key.to_string(), value.to_vec());
        self.cv.notify_all();
    }

    fn get(&self, key: &str, timeout: Duration) -> StoreResult<Vec<u8>> {
        let deadline = Instant::now() + timeout;
        let mut map = lock(&self.map);
        loop {
            if let Some(v) = map.get(key) {
                return Ok(v.clone());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(StoreError::Timeout {
                    key: key.to_string(),
                    waited: timeout,
                });
            }
            map = self
                .cv
                .wait_timeout(map, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn add(&self, key: &str, delta: i64) -> StoreResult<i64> {
        let mut map = lock(&self.map);
        let v = add_counter(key, map.get(key).map(|v| v.as_slice()), delta)?;
        map.insert(key.to_string(), v.to_string().into_bytes());
        drop(map);
        self.cv.notify_all();
        Ok(v)
    }
}

/// A store for threads of one process; clones share the same map.
#[derive(Clone, Default)]
pub struct InMemoryStore {
    inner: Arc<MemInner>,
}

impl InMemoryStore {
    pub fn new() -> InMemoryStore {
        InMemoryStore::default()
    }
}

impl KeyValueStore for InMemoryStore {
    fn set(&self, key: &str, value: &[u8]) -> StoreResult<()> {
        self.inner.set(key, value);
        Ok(())
    }
    fn get(&self, key: &str, timeout: Duration) -> StoreResult<Vec<u8>> {
        self.inner.get(key, timeout)
    }
    fn try_get(&self, key: &str) -> StoreResult<Option<Vec<u8>>> {
        Ok(lock(&self.inner.map).get(key).cloned())
    }
    fn add(&self, key: &str, delta: i64) -> StoreResult<i64> {
        self.inner.add(key, delta)
    }
}

// ---------------------------------------------------------------------------
// Hex

/// Lowercase hex of `bytes`.
pub fn hex_encode(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

/// Bytes of a hex string, or `None` if it is not one.
pub fn hex_decode(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    let digit = |c: u8| -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            b'A'..=b'F' => Some(c - b'A' + 10),
            _ => None,
        }
    };
    s.as_bytes()
        .chunks_exact(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect()
}

// ---------------------------------------------------------------------------
// File store

/// A store in a directory shared by processes on one host (or a shared
/// file system): one file per key, written by atomic rename.
#[derive(Clone, Debug)]
pub struct FileStore {
    dir: PathBuf,
}

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Age after which a counter's lock file is considered left by a dead
/// process.
const STALE_LOCK: Duration = Duration::from_secs(30);

impl FileStore {
    /// Uses (and creates) `dir`.
    pub fn new(dir: impl AsRef<Path>) -> StoreResult<FileStore> {
        fs::create_dir_all(dir.as_ref())?;
        Ok(FileStore {
            dir: dir.as_ref().to_path_buf(),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("k{}", hex_encode(key.as_bytes())))
    }

    fn write_atomic(&self, key: &str, value: &[u8]) -> StoreResult<()> {
        let tmp = self.dir.join(format!(
            "tmp.{}.{}",
            std::process::id(),
            TMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        {
            let mut f = fs::File::create(&tmp)?;
            f.write_all(value)?;
            f.sync_all()?;
        }
        fs::rename(&tmp, self.path(key)).map_err(|e| {
            let _ = fs::remove_file(&tmp);
            StoreError::from(e)
        })
    }

    fn read(&self, key: &str) -> StoreResult<Option<Vec<u8>>> {
        match fs::read(self.path(key)) {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        }
    }
}

impl KeyValueStore for FileStore {
    fn set(&self, key: &str, value: &[u8]) -> StoreResult<()> {
        self.write_atomic(key, value)
    }

    fn get(&self, key: &str, timeout: Duration) -> StoreResult<Vec<u8>> {
        let deadline = Instant::now() + timeout;
        let mut pause = Duration::from_millis(1);
        loop {
            if let Some(v) = self.read(key)? {
                return Ok(v);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(StoreError::Timeout {
                    key: key.to_string(),
                    waited: timeout,
                });
            }
            std::thread::sleep(pause.min(deadline - now));
            pause = (pause * 2).min(Duration::from_millis(20));
        }
    }

    fn try_get(&self, key: &str) -> StoreResult<Option<Vec<u8>>> {
        self.read(key)
    }

    fn add(&self, key: &str, delta: i64) -> StoreResult<i64> {
        let lock_path = self.dir.join(format!("l{}", hex_encode(key.as_bytes())));
        let deadline = Instant::now() + STALE_LOCK * 2;
        loop {
            match fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&lock_path)
            {
                Ok(_) => break,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    let stale = fs::metadata(&lock_path)
                        .and_then(|m| m.modified())
                        .ok()
                        .and_then(|t| SystemTime::now().duration_since(t).ok())
                        .is_some_and(|age| age > STALE_LOCK);
                    if stale {
                        let _ = fs::remove_file(&lock_path);
                        continue;
                    }
                    if Instant::now() >= deadline {
                        return Err(StoreError::Timeout {
                            key: format!("{key} (counter lock)"),
                            waited: STALE_LOCK * 2,
                        });
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => return Err(e.into()),
            }
        }
        let result = self
            .read(key)
            .and_then(|old| add_counter(key, old.as_deref(), delta))
            .and_then(|v| self.write_atomic(key, v.to_string().as_bytes()).map(|_| v));
        let _ = fs::remove_file(&lock_path);
        result
    }
}

// ---------------------------------------------------------------------------
// TCP server

/// Longest request line the server accepts (a 128-byte id is 256 hex chars).
const MAX_LINE: u64 = 64 << 20;

struct ServerState {
    mem: MemInner,
    shutdown: AtomicBool,
    connections: Mutex<Vec<TcpStream>>,
}

/// A TCP key-value server; runs on background threads until dropped or
/// [`TcpStoreServer::shutdown`].
pub struct TcpStoreServer {
    addr: SocketAddr,
    state: Arc<ServerState>,
    accept: Option<JoinHandle<()>>,
}

impl TcpStoreServer {
    /// Binds `addr` (port 0 picks a free port; see [`Self::local_addr`]).
    pub fn bind(addr: impl ToSocketAddrs) -> StoreResult<TcpStoreServer> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        let state = Arc::new(ServerState {
            mem: MemInner::default(),
            shutdown: AtomicBool::new(false),
            connections: Mutex::new(Vec::new()),
        });
        let st = state.clone();
        let accept = std::thread::Builder::new()
            .name("kv-store-accept".into())
            .spawn(move || accept_loop(listener, st))?;
        Ok(TcpStoreServer {
            addr,
            state,
            accept: Some(accept),
        })
    }

    /// The address clients connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting and closes every connection.
    pub fn shutdown(mut self) {
        self.stop();
    }

    /// Blocks the calling thread while the server runs (for the standalone
    /// binary).
    pub fn wait(mut self) {
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }

    fn stop(&mut self) {
        if self.state.shutdown.swap(true, Ordering::SeqCst) {
            return;
        }
        // Wake the blocking accept.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        for c in lock(&self.state.connections).drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
        self.state.mem.cv.notify_all();
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

impl Drop for TcpStoreServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn accept_loop(listener: TcpListener, state: Arc<ServerState>) {
    for conn in listener.incoming() {
        if state.shutdown.load(Ordering::SeqCst) {
            break;
        }
        let Ok(conn) = conn else { continue };
        let _ = conn.set_nodelay(true);
        if let Ok(c) = conn.try_clone() {
            let mut conns = lock(&state.connections);
            conns.retain(|c| c.peer_addr().is_ok());
            conns.push(c);
        }
        let st = state.clone();
        let _ = std::thread::Builder::new()
            .name("kv-store-conn".into())
            .spawn(move || serve_connection(conn, st));
    }
}

fn serve_connection(conn: TcpStream, state: Arc<ServerState>) {
    let Ok(write_half) = conn.try_clone() else {
        return;
    };
    let mut writer = write_half;
    let mut reader = BufReader::new(conn);
    let mut line = Vec::new();
    loop {
        line.clear();
        match (&mut reader).take(MAX_LINE).read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        if line.last() != Some(&b'\n') {
            // Oversized or truncated line.
            let _ = writer.write_all(b"ERR line too long\n");
            return;
        }
        let reply = handle_request(&line, &state);
        if writer.write_all(reply.as_bytes()).is_err() {
            return;
        }
        if state.shutdown.load(Ordering::SeqCst) {
            return;
        }
    }
}

fn handle_request(line: &[u8], state: &ServerState) -> String {
    let Ok(text) = std::str::from_utf8(line) else {
        return "ERR request is not UTF-8\n".into();
    };
    let text = text.trim_end_matches(['\n', '\r']);
    let mut parts = text.split(' ');
    let cmd = parts.next().unwrap_or("");
    let args: Vec<&str> = parts.collect();
    let key = |i: usize| -> Result<String, String> {
        let h = args.get(i).ok_or("missing key")?;
        let b = hex_decode(h).ok_or("key is not hex")?;
        String::from_utf8(b).map_err(|_| "key is not UTF-8".to_string())
    };
    let result: Result<String, String> = (|| match (cmd, args.len()) {
        ("SET", 2) => {
            let value = hex_decode(args[1]).ok_or("value is not hex")?;
            state.mem.set(&key(0)?, &value);
            Ok("OK".to_string())
        }
        ("GET", 2) => {
            let ms: u64 = args[1].parse().map_err(|_| "bad timeout")?;
            match state.mem.get(&key(0)?, Duration::from_millis(ms)) {
                Ok(v) => Ok(format!("VAL {}", hex_encode(&v))),
                Err(StoreError::Timeout { .. }) => Ok("TIMEOUT".to_string()),
                Err(e) => Err(e.to_string()),
            }
        }
        ("TRY", 1) => Ok(match lock(&state.mem.map).get(&key(0)?) {
            Some(v) => format!("VAL {}", hex_encode(v)),
            None => "NONE".to_string(),
        }),
        ("ADD", 2) => {
            let delta: i64 = args[1].parse().map_err(|_| "bad delta")?;
            let v = state.mem.add(&key(0)?, delta).map_err(|e| e.to_string())?;
            Ok(format!("NUM {v}"))
        }
        ("PING", 0) => Ok("PONG".to_string()),
        _ => Err(format!(
            "unknown request {cmd:?} with {} arguments",
            args.len()
        )),
    })();
    match result {
        Ok(r) => r + "\n",
        Err(e) => format!("ERR {}\n", e.replace('\n', " ")),
    }
}

// ---------------------------------------------------------------------------
// TCP client

/// A client of a [`TcpStoreServer`]. One connection, one request at a time
/// (requests from several threads are serialized).
pub struct TcpStore {
    addr: SocketAddr,
    conn: Mutex<Option<BufReader<TcpStream>>>,
}

/// Margin added to socket timeouts beyond a request's own wait.
const IO_MARGIN: Duration = Duration::from_secs(10);

impl TcpStore {
    /// Connects to `addr`, retrying until `timeout` (the server may start
    /// after the clients).
    pub fn connect(addr: impl ToSocketAddrs, timeout: Duration) -> StoreResult<TcpStore> {
        let addrs: Vec<SocketAddr> = addr.to_socket_addrs()?.collect();
        let first = *addrs
            .first()
            .ok_or_else(|| StoreError::InvalidArgument("address resolves to nothing".into()))?;
        let deadline = Instant::now() + timeout;
        let mut pause = Duration::from_millis(5);
        loop {
            let mut last_err = None;
            for a in &addrs {
                let left = deadline.saturating_duration_since(Instant::now());
                match TcpStream::connect_timeout(a, left.max(Duration::from_millis(10))) {
                    Ok(s) => {
                        let _ = s.set_nodelay(true);
                        let store = TcpStore {
                            addr: *a,
                            conn: Mutex::new(Some(BufReader::new(s))),
                        };
                        return Ok(store);
                    }
                    Err(e) => last_err = Some(e),
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(StoreError::Io(format!(
                    "cannot connect to key-value store at {first} within {timeout:?}: {}",
                    last_err.map(|e| e.to_string()).unwrap_or_default()
                )));
            }
            std::thread::sleep(pause.min(deadline - now));
            pause = (pause * 2).min(Duration::from_millis(100));
        }
    }

    /// The server's address.
    pub fn server_addr(&self) -> SocketAddr {
        self.addr
    }

    fn request(&self, line: &str, wait: Duration) -> StoreResult<String> {
        let mut guard = lock(&self.conn);
        let conn = match guard.as_mut() {
            Some(c) => c,
            None => {
                let s = TcpStream::connect_timeout(&self.addr, IO_MARGIN)?;
                let _ = s.set_nodelay(true);
                guard.insert(BufReader::new(s))
            }
        };
        let io_timeout = wait + IO_MARGIN;
        let result = (|| -> StoreResult<String> {
            let s = conn.get_mut();
            s.set_read_timeout(Some(io_timeout))?;
            s.set_write_timeout(Some(io_timeout))?;
            s.write_all(line.as_bytes())?;
            s.write_all(b"\n")?;
            let mut reply = Vec::new();
            conn.by_ref().take(MAX_LINE).read_until(b'\n', &mut reply)?;
            if reply.last() != Some(&b'\n') {
                return Err(StoreError::Io(
                    "connection closed by the key-value server".into(),
                ));
            }
            reply.pop();
            String::from_utf8(reply).map_err(|_| StoreError::Protocol("reply is not UTF-8".into()))
        })();
        if result.is_err() {
            // The stream may be out of step; reconnect next time.
            *guard = None;
        }
        let reply = result?;
        match reply.strip_prefix("ERR ") {
            Some(msg) => Err(StoreError::Protocol(format!("server: {msg}"))),
            None => Ok(reply),
        }
    }

    /// Round trip to the server.
    pub fn ping(&self) -> StoreResult<()> {
        match self.request("PING", Duration::ZERO)?.as_str() {
            "PONG" => Ok(()),
            r => Err(StoreError::Protocol(format!("unexpected reply {r:?}"))),
        }
    }
}

fn parse_val(reply: &str) -> StoreResult<Vec<u8>> {
    reply
        .strip_prefix("VAL ")
        .and_then(hex_decode)
        .ok_or_else(|| StoreError::Protocol(format!("unexpected reply {reply:?}")))
}

impl KeyValueStore for TcpStore {
    fn set(&self, key: &str, value: &[u8]) -> StoreResult<()> {
        let r = self.request(
            &format!("SET {} {}", hex_encode(key.as_bytes()), hex_encode(value)),
            Duration::ZERO,
        )?;
        if r == "OK" {
            Ok(())
        } else {
            Err(StoreError::Protocol(format!("unexpected reply {r:?}")))
        }
    }

    fn get(&self, key: &str, timeout: Duration) -> StoreResult<Vec<u8>> {
        let ms = timeout.as_millis().min(u64::MAX as u128) as u64;
        let r = self.request(&format!("GET {} {ms}", hex_encode(key.as_bytes())), timeout)?;
        if r == "TIMEOUT" {
            return Err(StoreError::Timeout {
                key: key.to_string(),
                waited: timeout,
            });
        }
        parse_val(&r)
    }

    fn try_get(&self, key: &str) -> StoreResult<Option<Vec<u8>>> {
        let r = self.request(
            &format!("TRY {}", hex_encode(key.as_bytes())),
            Duration::ZERO,
        )?;
        if r == "NONE" {
            return Ok(None);
        }
        parse_val(&r).map(Some)
    }

    fn add(&self, key: &str, delta: i64) -> StoreResult<i64> {
        let r = self.request(
            &format!("ADD {} {delta}", hex_encode(key.as_bytes())),
            Duration::ZERO,
        )?;
        r.strip_prefix("NUM ")
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| StoreError::Protocol(format!("unexpected reply {r:?}")))
    }
}

impl<T: KeyValueStore + ?Sized> KeyValueStore for Arc<T> {
    fn set(&self, key: &str, value: &[u8]) -> StoreResult<()> {
        (**self).set(key, value)
    }
    fn get(&self, key: &str, timeout: Duration) -> StoreResult<Vec<u8>> {
        (**self).get(key, timeout)
    }
    fn try_get(&self, key: &str) -> StoreResult<Option<Vec<u8>>> {
        (**self).try_get(key)
    }
    fn add(&self, key: &str, delta: i64) -> StoreResult<i64> {
        (**self).add(key, delta)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exercise(store: &dyn KeyValueStore) {
        assert_eq!(store.try_get("a").unwrap(), None);
        store.set("a", b"\x00\n xyz").unwrap();
        assert_eq!(
            store.get("a", Duration::from_millis(10)).unwrap(),
            b"\x00\n xyz"
        );
        store.set("empty", b"").unwrap();
        assert_eq!(store.try_get("empty").unwrap(), Some(vec![]));
        assert_eq!(store.add("n", 2).unwrap(), 2);
        assert_eq!(store.add("n", -5).unwrap(), -3);
        assert!(matches!(
            store.get("missing key with spaces", Duration::from_millis(30)),
            Err(StoreError::Timeout { .. })
        ));
        assert!(store.add("a", 1).is_err());
    }

    #[test]
    fn hex_round_trip() {
        let b: Vec<u8> = (0..=255).collect();
        assert_eq!(hex_decode(&hex_encode(&b)).unwrap(), b);
        assert!(hex_decode("abc").is_none());
        assert!(hex_decode("zz").is_none());
    }

    #[test]
    fn in_memory() {
        exercise(&InMemoryStore::new());
    }

    #[test]
    fn file_store() {
        let dir = std::env::temp_dir().join(format!(
            "collectives-filestore-{}-{}",
            std::process::id(),
            TMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        exercise(&FileStore::new(&dir).unwrap());
        let _ = fs::remove_dir_all(dir);
    }

    #[test]
    fn tcp_store() {
        let server = TcpStoreServer::bind("127.0.0.1:0").unwrap();
        let client = TcpStore::connect(server.local_addr(), Duration::from_secs(5)).unwrap();
        client.ping().unwrap();
        exercise(&client);
        // A blocking get released by another client's set.
        let addr = server.local_addr();
        let t = std::thread::spawn(move || {
            let c = TcpStore::connect(addr, Duration::from_secs(5)).unwrap();
            c.get("late", Duration::from_secs(10)).unwrap()
        });
        std::thread::sleep(Duration::from_millis(50));
        client.set("late", b"here").unwrap();
        assert_eq!(t.join().unwrap(), b"here");
        // Malformed requests get ERR, the connection stays usable.
        let mut raw = TcpStream::connect(addr).unwrap();
        raw.write_all(b"BOGUS\nSET zz 00\nPING\n").unwrap();
        let mut r = BufReader::new(raw);
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        assert!(line.starts_with("ERR"), "{line}");
        line.clear();
        r.read_line(&mut line).unwrap();
        assert!(line.starts_with("ERR"), "{line}");
        line.clear();
        r.read_line(&mut line).unwrap();
        assert_eq!(line, "PONG\n");
        server.shutdown();
        assert!(client.ping().is_err());
    }
}
