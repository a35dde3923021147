//! End-to-end tests of the `hlo-opt` binary: printing, atomic `-o`, `--stats`
//! against XLA's own collective counts (case.json), and bad input.

use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

fn hlo_opt() -> Command {
    Command::new(env!("CARGO_BIN_EXE_hlo-opt"))
}

/// Case directories (with case.json) in testdata and, if present, ../shared/corpus.
fn case_dirs() -> Vec<PathBuf> {
    let mut parents = vec![xla_test_paths::testdata_cases()];
    parents.extend(xla_test_paths::shared_corpus_cases());
    let mut dirs: Vec<PathBuf> = parents
        .iter()
        .filter_map(|p| std::fs::read_dir(p).ok())
        .flat_map(|rd| rd.flatten().map(|e| e.path()))
        .filter(|p| p.join("case.json").is_file())
        .collect();
    dirs.sort();
    dirs
}

#[test]
fn stats_match_xlas_collective_counts_and_bytes() {
    let dirs = case_dirs();
    assert!(!dirs.is_empty(), "no cases found");
    for dir in &dirs {
        let case: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("case.json")).unwrap()).unwrap();
        let out = hlo_opt()
            .arg(dir.join("xla_partitioned.hlo"))
            .arg("--stats")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        let stats: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            stats["collective_bytes"],
            case["xla_collective_bytes"],
            "{}",
            dir.display()
        );
        for (op, count) in case["xla_collectives"].as_object().unwrap() {
            let ours = stats["collectives"]
                .get(op)
                .cloned()
                .unwrap_or(Value::from(0));
            assert_eq!(&ours, count, "{}: {op}", dir.display());
        }
        let histogram = case["xla_partitioned_opcode_histogram"]
            .as_object()
            .unwrap();
        for (op, count) in histogram {
            assert_eq!(
                &stats["opcodes"][op],
                count,
                "{}: opcode {op}",
                dir.display()
            );
        }
        let total: u64 = histogram.values().map(|v| v.as_u64().unwrap()).sum();
        assert_eq!(
            stats["instructions"].as_u64().unwrap(),
            total,
            "{}",
            dir.display()
        );
    }
}

#[test]
fn prints_to_stdout_and_writes_atomically() {
    let input = xla_test_paths::testdata_case("tp_mlp_erf_gelu").join("input.hlo");
    let out = hlo_opt().arg(&input).output().unwrap();
    assert!(out.status.success());
    let printed = String::from_utf8(out.stdout).unwrap();
    assert!(printed.starts_with("HloModule "));

    let dir = tempdir();
    let dst = dir.join("out.hlo");
    let status = hlo_opt().arg(&input).arg("-o").arg(&dst).status().unwrap();
    assert!(status.success());
    assert_eq!(std::fs::read_to_string(&dst).unwrap(), printed);
    // No temporary files are left behind.
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
}

/// `-o` onto something that is not a regular file (here a FIFO, as
/// `/dev/null` is a device) writes into it and leaves it what it was:
/// renaming a temporary file over it would turn it into a regular file.
#[test]
fn output_onto_a_fifo_writes_into_it_and_keeps_it() {
    use std::os::unix::fs::FileTypeExt;
    let input = xla_test_paths::testdata_case("tp_mlp_erf_gelu").join("input.hlo");
    let dir = tempdir();
    let fifo = dir.join("pipe");
    let made = Command::new("mkfifo").arg(&fifo).status();
    if !made.is_ok_and(|s| s.success()) {
        eprintln!("skipped: mkfifo is not available");
        return;
    }
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read_to_string(fifo).unwrap())
    };
    let status = hlo_opt().arg(&input).arg("-o").arg(&fifo).status().unwrap();
    assert!(status.success());
    // Checked before joining: a replaced FIFO never gets a writer.
    let kind = std::fs::symlink_metadata(&fifo).unwrap().file_type();
    assert!(kind.is_fifo(), "the FIFO was replaced: {kind:?}");
    let text = reader.join().unwrap();
    assert!(text.starts_with("HloModule "), "{text}");
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        1,
        "no temporary files"
    );
}

#[test]
fn bad_input_is_a_clear_error_and_writes_nothing() {
    let dir = tempdir();
    let bad = dir.join("bad.hlo");
    std::fs::write(
        &bad,
        "HloModule m\nENTRY e {\n  a = f32[2] parameter(0)\n  ROOT b = f32[2] add(a, nope)\n}\n",
    )
    .unwrap();
    let dst = dir.join("out.hlo");
    let out = hlo_opt().arg(&bad).arg("-o").arg(&dst).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("bad.hlo:4:26"), "{stderr}");
    assert!(stderr.contains("'nope' is not defined"), "{stderr}");
    assert!(!dst.exists(), "no output on error");

    // A module that parses but does not verify: the verifier names the instruction.
    std::fs::write(
        &bad,
        "HloModule m\nENTRY e {\n  a = f32[2] parameter(0)\n  ROOT b = f32[3] add(a, a)\n}\n",
    )
    .unwrap();
    let out = hlo_opt().arg(&bad).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("does not verify") && stderr.contains('b'),
        "{stderr}"
    );

    let out = hlo_opt().arg(dir.join("missing.hlo")).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read"));
}

fn tempdir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "hlo-opt-test-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `--repeat N` runs the passes N times, logging each run's pass times,
/// and prints the same module as one run; 0 is refused.
#[test]
fn repeat_runs_the_passes_again_on_fresh_copies() {
    let dir = case_dirs().into_iter().next().expect("a case");
    let input = dir.join("input.hlo");
    let run = |repeat: &str| {
        hlo_opt()
            .arg(&input)
            .arg("--passes=sharding-propagation,spmd-partitioning")
            .args(["--repeat", repeat])
            .env("RUST_LOG", "info")
            .output()
            .unwrap()
    };
    let once = run("1");
    let thrice = run("3");
    assert!(once.status.success() && thrice.status.success());
    assert_eq!(once.stdout, thrice.stdout, "--repeat changed the output");
    let partitioning_runs = |out: &std::process::Output| {
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .filter(|l| l.contains("xla_hlo_pass") && l.contains("pass spmd-partitioning:"))
            .count()
    };
    assert_eq!(partitioning_runs(&once), 1);
    assert_eq!(partitioning_runs(&thrice), 3);
    let refused = run("0");
    assert!(!refused.status.success());
}
