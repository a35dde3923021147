//! `--spawn-local P`: runs this same command as P local processes of one
//! multi-process run and reports it as one.
//!
//! The parent hosts the coordinator (a TCP key-value store on 127.0.0.1,
//! free port) and starts P children with `--num-processes P --process-id i
//! --coordinator ADDR --external-coordinator` in place of `--spawn-local`.
//! Process 0's stdout (the run's JSON line) becomes the parent's stdout;
//! the other processes' lines go to stderr prefixed with their id; stderr
//! is shared.
//!
//! Invariants: the parent exits 0 only when every child did; once one child
//! has failed, the others are given `timeout` + 5 s to notice (they fail
//! on their own when a peer is lost) and are then killed, so the parent
//! never waits forever.

use anyhow::{bail, Context, Result};
use collectives::TcpStoreServer;
use std::ffi::OsString;
use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Grace beyond the peer timeout before a straggler is killed.
const GRACE: Duration = Duration::from_secs(5);

/// This command's arguments without `--spawn-local P` / `--spawn-local=P`.
fn forwarded_arguments() -> Vec<OsString> {
    let mut out = Vec::new();
    let mut args = std::env::args_os().skip(1);
    while let Some(a) = args.next() {
        if a == "--spawn-local" {
            args.next();
        } else if !a.to_string_lossy().starts_with("--spawn-local=") {
            out.push(a);
        }
    }
    out
}

/// Runs P children and returns the exit code the parent should exit with.
pub fn spawn_local(processes: usize, timeout_s: f64) -> Result<i32> {
    if processes == 0 {
        bail!("--spawn-local needs at least one process");
    }
    let server = TcpStoreServer::bind("127.0.0.1:0").context("starting the coordinator")?;
    let coordinator = server.local_addr().to_string();
    let exe = std::env::current_exe().context("finding this executable")?;
    let forwarded = forwarded_arguments();
    let mut children: Vec<(Child, JoinHandle<String>)> = Vec::new();
    for id in 0..processes {
        let spawned = Command::new(&exe)
            .args(&forwarded)
            .args(["--num-processes", &processes.to_string()])
            .args(["--process-id", &id.to_string()])
            .args(["--coordinator", &coordinator, "--external-coordinator"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn();
        let mut child = match spawned {
            Ok(c) => c,
            Err(e) => {
                for (c, _) in &mut children {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                return Err(e).with_context(|| format!("starting process {id}"));
            }
        };
        let mut stdout = child.stdout.take().expect("stdout is piped");
        let reader = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = stdout.read_to_string(&mut text);
            text
        });
        children.push((child, reader));
    }
    let timeout = Duration::try_from_secs_f64(timeout_s.max(0.0)).unwrap_or(Duration::MAX);
    let codes = wait_all(&mut children, timeout);
    let mut failed = false;
    for (id, ((_, reader), code)) in children.into_iter().zip(&codes).enumerate() {
        let text = reader.join().unwrap_or_default();
        if id == 0 {
            print!("{text}");
        } else {
            for line in text.lines() {
                eprintln!("process {id}: {line}");
            }
        }
        match code {
            Exit::Code(0) => {}
            Exit::Code(c) => {
                failed = true;
                eprintln!("process {id} exited with status {c}");
            }
            Exit::Signal => {
                failed = true;
                eprintln!("process {id} was killed by a signal");
            }
            Exit::Killed(after) => {
                failed = true;
                eprintln!(
                    "process {id} had not exited {:.1} s after process {after} failed; killed it",
                    (timeout + GRACE).as_secs_f64()
                );
            }
        }
    }
    drop(server);
    Ok(if failed { 1 } else { 0 })
}

/// How one child ended.
enum Exit {
    Code(i32),
    Signal,
    /// Killed by the parent; the first process that had failed.
    Killed(usize),
}

/// Waits for every child; once one fails, the rest get `timeout + GRACE`.
fn wait_all(children: &mut [(Child, JoinHandle<String>)], timeout: Duration) -> Vec<Exit> {
    let mut exits: Vec<Option<Exit>> = children.iter().map(|_| None).collect();
    let mut first_failure: Option<(usize, Instant)> = None;
    while exits.iter().any(Option::is_none) {
        for (id, (child, _)) in children.iter_mut().enumerate() {
            if exits[id].is_some() {
                continue;
            }
            let status = match child.try_wait() {
                Ok(Some(status)) => status,
                Ok(None) => continue,
                Err(_) => {
                    exits[id] = Some(Exit::Signal);
                    continue;
                }
            };
            let exit = match status.code() {
                Some(c) => Exit::Code(c),
                None => Exit::Signal,
            };
            if !matches!(exit, Exit::Code(0)) && first_failure.is_none() {
                first_failure = Some((id, Instant::now()));
            }
            exits[id] = Some(exit);
        }
        if let Some((failed, at)) = first_failure {
            if at.elapsed() > timeout.saturating_add(GRACE) {
                for (id, (child, _)) in children.iter_mut().enumerate() {
                    if exits[id].is_none() {
                        let _ = child.kill();
                        let _ = child.wait();
                        exits[id] = Some(Exit::Killed(failed));
                    }
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    exits.into_iter().flatten().collect()
}
