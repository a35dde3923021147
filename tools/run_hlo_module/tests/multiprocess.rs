//! Multi-process runs of `run_hlo_module`: the same case run as 1 process
//! of N devices and as P processes of N/P devices (collectives over TCP on
//! 127.0.0.1) gives bitwise-identical outputs that match XLA's; and the
//! faults an NCCL user expects to be told about (a process killed
//! mid-collective, no coordinator, different programs, a wrong process
//! count) end every process within the timeout + 5 s, naming the cause,
//! without writing an output file.
//!
//! `RUN_HLO_MODULE_SWEEP=all` runs every testdata case (and the shared
//! corpus when it is beside the checkout) instead of the sample.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn tool() -> Command {
    Command::new(env!("CARGO_BIN_EXE_run_hlo_module"))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The case's device count (case.json's num_partitions, else the module's).
fn device_count(case: &Path) -> usize {
    let json: serde_json::Value = std::fs::read_to_string(case.join("case.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default();
    json["num_partitions"].as_u64().unwrap_or(8) as usize
}

/// Whether case.json sets rtol or atol.
fn has_tolerance(case: &Path) -> bool {
    let json: serde_json::Value = std::fs::read_to_string(case.join("case.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default();
    json.get("rtol").is_some() || json.get("atol").is_some()
}

/// Every out*.npy of `dir`, in order.
fn outputs(dir: &Path) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for i in 0.. {
        match std::fs::read(dir.join(format!("out{i}.npy"))) {
            Ok(b) => out.push(b),
            Err(_) => break,
        }
    }
    out
}

/// One mode of running a case: (label, arguments before the split flags).
fn modes(case: &Path) -> Vec<(&'static str, Vec<std::ffi::OsString>)> {
    let mut modes = vec![(
        "--partition",
        vec!["--case".into(), case.into(), "--partition".into()],
    )];
    if case.join("xla_partitioned.hlo").exists() && case.join("propagated.hlo").exists() {
        let mut args: Vec<std::ffi::OsString> = vec![
            case.join("xla_partitioned.hlo").into(),
            "--shardings-from".into(),
            case.join("propagated.hlo").into(),
        ];
        if case.join("args").exists() {
            args.extend(["--args".into(), case.join("args").into()]);
        }
        if case.join("expected").exists() {
            args.extend(["--expected".into(), case.join("expected").into()]);
        }
        if case.join("case.json").exists() {
            args.extend(["--case-json".into(), case.join("case.json").into()]);
        }
        modes.push(("--shardings-from", args));
    }
    modes
}

/// Runs `case` in every mode as 1, 2, 4 and 8 processes (those that divide
/// its devices); returns the failures.
fn check_splits(case: &Path, scratch: &Path) -> Vec<String> {
    let n = device_count(case);
    let name = case.file_name().unwrap().to_string_lossy().into_owned();
    let mut failures = Vec::new();
    for (label, args) in modes(case) {
        let mut reference: Option<Vec<Vec<u8>>> = None;
        for processes in [1usize, 2, 4, 8].into_iter().filter(|p| n % p == 0) {
            let dir = scratch.join(format!("{name}{label}-{processes}"));
            let _ = std::fs::remove_dir_all(&dir);
            let mut cmd = tool();
            // The case's own tolerance (case.json) where it has one.
            cmd.args(&args);
            if !has_tolerance(case) {
                cmd.args(["--rtol", "1e-4", "--atol", "1e-4"]);
            }
            cmd.args(["--output".as_ref(), dir.as_os_str()]);
            cmd.args(["--timeout", "60"]);
            if processes > 1 {
                cmd.args(["--spawn-local", &processes.to_string()]);
            }
            let out = cmd.output().unwrap();
            let line = text(&out.stdout);
            let what = format!("{name} {label} as {processes} x {}", n / processes);
            if !out.status.success() {
                failures.push(format!("{what}: {line} {}", text(&out.stderr)));
                continue;
            }
            let j: serde_json::Value = serde_json::from_str(line.trim()).unwrap_or_default();
            if j.get("all_matched").is_some() && j["all_matched"] != true {
                failures.push(format!("{what}: does not match XLA: {line}"));
            }
            let got = outputs(&dir);
            if got.is_empty() {
                failures.push(format!("{what}: wrote no outputs"));
            }
            match &reference {
                None => reference = Some(got),
                Some(r) if *r != got => {
                    failures.push(format!("{what}: outputs differ from 1 process"))
                }
                Some(_) => {}
            }
        }
    }
    failures
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("run_hlo_module-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn process_splits_give_bitwise_identical_outputs() {
    let sweep_all = std::env::var("RUN_HLO_MODULE_SWEEP").as_deref() == Ok("all");
    let cases: Vec<PathBuf> = if sweep_all {
        let mut all = xla_test_paths::case_dirs(&xla_test_paths::testdata_cases());
        if let Some(corpus) = xla_test_paths::shared_corpus_cases() {
            all.extend(xla_test_paths::case_dirs(&corpus));
        }
        all
    } else {
        [
            "transformer_block_2x4_causal",
            "dp_mlp_3layer",
            "uneven_sharding_slices",
            "dot_reduce_scatter_2x4",
            "cond_switch_2x4",
            "conv2d_height_sharded_uneven",
            "argsort_permute_uneven_8",
            "context_parallel_attention_mesh3d",
        ]
        .iter()
        .map(|c| xla_test_paths::testdata_case(c))
        .collect()
    };
    let dir = scratch("splits");
    let mut failures = Vec::new();
    for case in &cases {
        failures.extend(check_splits(case, &dir));
    }
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!("{} cases, {} failures", cases.len(), failures.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A free port on 127.0.0.1 (bound, then released for the coordinator).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A 4-device program that all-reduces in a loop that never ends.
const ENDLESS_ALL_REDUCE: &str = r#"HloModule endless, num_partitions=4

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%cond (c: (s32[], f32[256])) -> pred[] {
  %c = (s32[], f32[256]) parameter(0)
  %i = s32[] get-tuple-element(%c), index=0
  %zero = s32[] constant(0)
  ROOT %go = pred[] compare(%i, %zero), direction=GE
}

%body (c: (s32[], f32[256])) -> (s32[], f32[256]) {
  %c = (s32[], f32[256]) parameter(0)
  %i = s32[] get-tuple-element(%c), index=0
  %x = f32[256] get-tuple-element(%c), index=1
  %r = f32[256] all-reduce(%x), channel_id=1, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=%add
  %quarter = f32[] constant(0.25)
  %q = f32[256] broadcast(%quarter), dimensions={}
  %y = f32[256] multiply(%r, %q)
  %one = s32[] constant(1)
  %j = s32[] add(%i, %one)
  ROOT %t = (s32[], f32[256]) tuple(%j, %y)
}

ENTRY %main (x: f32[256]) -> f32[256] {
  %x = f32[256] parameter(0)
  %zero = s32[] constant(0)
  %init = (s32[], f32[256]) tuple(%zero, %x)
  %w = (s32[], f32[256]) while(%init), condition=%cond, body=%body
  ROOT %out = f32[256] get-tuple-element(%w), index=1
}
"#;

/// The same program with a different constant (a different fingerprint).
fn endless_variant() -> String {
    ENDLESS_ALL_REDUCE.replace("constant(0.25)", "constant(0.5)")
}

/// Starts process `id` of `processes` on `module`, coordinator on `port`
/// (hosted by process 0).
fn start(module: &Path, processes: usize, id: usize, port: u16, output: &Path) -> Child {
    tool()
        .arg(module)
        .args(["--devices", "4", "--timeout", "3"])
        .args(["--num-processes", &processes.to_string()])
        .args(["--process-id", &id.to_string()])
        .args(["--coordinator", &format!("127.0.0.1:{port}")])
        .args(["--output".as_ref(), output.as_os_str()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for every child, killing those still running after `bound`.
fn finish(children: Vec<Child>, bound: Duration) -> Vec<(Output, Duration)> {
    let t = Instant::now();
    let mut children: Vec<Option<Child>> = children.into_iter().map(Some).collect();
    let mut ended: Vec<Option<Duration>> = vec![None; children.len()];
    while ended.iter().any(Option::is_none) && t.elapsed() < bound {
        for (i, c) in children.iter_mut().enumerate() {
            if ended[i].is_none() && c.as_mut().unwrap().try_wait().unwrap().is_some() {
                ended[i] = Some(t.elapsed());
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    children
        .iter_mut()
        .zip(ended)
        .map(|(c, e)| {
            let mut c = c.take().unwrap();
            if e.is_none() {
                let _ = c.kill();
            }
            (c.wait_with_output().unwrap(), e.unwrap_or(Duration::MAX))
        })
        .collect()
}

const TIMEOUT_PLUS_5: Duration = Duration::from_secs(3 + 5);

fn write_module(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// Every process ended non-zero within the bound, none wrote an output,
/// and some process's error contains `needle`.
fn assert_refused(results: &[(Output, Duration)], outputs: &[PathBuf], needle: &str) {
    let mut all = String::new();
    for (id, (out, took)) in results.iter().enumerate() {
        all += &format!(
            "process {id} ({:?}, {took:?}): {}{}\n",
            out.status,
            text(&out.stdout),
            text(&out.stderr)
        );
    }
    for (id, (out, took)) in results.iter().enumerate() {
        assert!(*took <= TIMEOUT_PLUS_5, "process {id} took {took:?}\n{all}");
        assert!(!out.status.success(), "process {id} succeeded\n{all}");
    }
    for o in outputs {
        assert!(!o.exists(), "{} was written\n{all}", o.display());
    }
    assert!(all.contains(needle), "no process says {needle:?}\n{all}");
}

#[test]
fn a_process_killed_mid_collective_fails_every_other_naming_it() {
    let dir = scratch("kill");
    let module = write_module(&dir, "endless.hlo", ENDLESS_ALL_REDUCE);
    let port = free_port();
    let outputs: Vec<PathBuf> = (0..4).map(|i| dir.join(format!("out{i}"))).collect();
    let mut children: Vec<Child> = (0..4)
        .map(|i| start(&module, 4, i, port, &outputs[i]))
        .collect();
    // Long enough to be inside the loop's all-reduces.
    std::thread::sleep(Duration::from_millis(1500));
    for (i, c) in children.iter_mut().enumerate() {
        assert!(
            c.try_wait().unwrap().is_none(),
            "process {i} ended before the kill"
        );
    }
    children[2].kill().unwrap(); // SIGKILL
    let killed_at = Instant::now();
    let results = finish(children, TIMEOUT_PLUS_5 + Duration::from_secs(2));
    let survivors: Vec<(Output, Duration)> = results
        .into_iter()
        .enumerate()
        .filter(|(i, _)| *i != 2)
        .map(|(_, r)| r)
        .collect();
    assert!(killed_at.elapsed() < TIMEOUT_PLUS_5 + Duration::from_secs(2));
    assert_refused(&survivors, &outputs, "process 2");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_unreachable_coordinator_is_refused_before_running() {
    let dir = scratch("nocoord");
    let module = write_module(&dir, "endless.hlo", ENDLESS_ALL_REDUCE);
    let port = free_port();
    let output = dir.join("out");
    let child = tool()
        .arg(&module)
        .args(["--devices", "4", "--timeout", "3"])
        .args(["--num-processes", "2", "--process-id", "1"])
        .args(["--coordinator", &format!("127.0.0.1:{port}")])
        .arg("--external-coordinator")
        .args(["--output".as_ref(), output.as_os_str()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let results = finish(vec![child], TIMEOUT_PLUS_5 + Duration::from_secs(2));
    assert_refused(&results, &[output], "cannot reach the coordinator");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Process 0 runs ENDLESS_ALL_REDUCE as one of 2; process 1 runs
/// `second_module` as one of `second_processes`: both must be refused.
fn two_processes_refused(name: &str, second_module: &str, second_processes: usize, needle: &str) {
    let dir = scratch(name);
    let a = write_module(&dir, "a.hlo", ENDLESS_ALL_REDUCE);
    let b = write_module(&dir, "b.hlo", second_module);
    let port = free_port();
    let outputs: Vec<PathBuf> = (0..2).map(|i| dir.join(format!("out{i}"))).collect();
    let children = vec![
        start(&a, 2, 0, port, &outputs[0]),
        start(&b, second_processes, 1, port, &outputs[1]),
    ];
    let results = finish(children, TIMEOUT_PLUS_5 + Duration::from_secs(2));
    assert_refused(&results, &outputs, needle);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn processes_holding_different_programs_are_refused() {
    two_processes_refused("mismatch", &endless_variant(), 2, "different program");
}

#[test]
fn a_wrong_process_count_is_refused() {
    two_processes_refused("worldsize", ENDLESS_ALL_REDUCE, 4, "was started for");
}

/// `--spawn-local` reports a child's failure as its own (exit 1) and does
/// not wait past the timeout + 5 s for the others.
#[test]
fn spawn_local_fails_when_a_process_fails() {
    let dir = scratch("spawnfail");
    let module = write_module(&dir, "endless.hlo", ENDLESS_ALL_REDUCE);
    let output = dir.join("out");
    // 3 processes cannot share 4 devices: every process refuses.
    let child = tool()
        .arg(&module)
        .args(["--devices", "4", "--timeout", "3", "--spawn-local", "3"])
        .args(["--output".as_ref(), output.as_os_str()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let results = finish(vec![child], TIMEOUT_PLUS_5 + Duration::from_secs(2));
    assert_refused(&results, &[output], "do not divide evenly");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--collectives nccl` in a build without NCCL is refused by every process,
/// naming the feature, and writes no output.
#[test]
#[cfg(not(feature = "nccl"))]
fn nccl_collectives_without_the_feature_are_named() {
    let dir = scratch("nonccl");
    let module = write_module(&dir, "endless.hlo", ENDLESS_ALL_REDUCE);
    let output = dir.join("out");
    let child = tool()
        .arg(&module)
        .args(["--devices", "4", "--timeout", "3", "--spawn-local", "2"])
        .args(["--collectives", "nccl"])
        .args(["--output".as_ref(), output.as_os_str()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let results = finish(vec![child], TIMEOUT_PLUS_5 + Duration::from_secs(2));
    assert_refused(&results, &[output], "`nccl` feature");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The CUDA backend's plans (kernels built for the host, `--backend
/// cuda-host`) in two processes of four devices each: our partitioned
/// program's collectives cross processes over TCP through the executor's
/// host steps, and the outputs match XLA's.
#[test]
fn cuda_host_backend_across_two_processes_matches_xla() {
    for case in [
        "fori_loop_accumulating_tp_dot",
        "cond_switch_2x4",
        "dot_reduce_scatter_2x4",
    ] {
        let dir = xla_test_paths::testdata_case(case);
        let out = tool()
            .arg("--case")
            .arg(&dir)
            .args([
                "--partition",
                "--backend",
                "cuda-host",
                "--spawn-local",
                "2",
            ])
            .output()
            .unwrap();
        let stdout = text(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("\"all_matched\":true"),
            "{case}: {stdout}\n{}",
            text(&out.stderr)
        );
        let all = format!("{stdout}{}", text(&out.stderr));
        assert!(all.contains("process 1:"), "{case}: {all}");
    }
}
