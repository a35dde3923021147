//! Bad input to `run_hlo_module` and `hlo-opt` (issue 24's classes): device
//! counts the verifier must bound, replica groups naming more devices than
//! exist, a zero mesh axis, and dimensions too large to allocate, in a
//! parameter and in an intermediate. Each must exit 1 with a message that
//! names the file, line:column and instruction (or parameter), write no
//! output, and neither panic nor abort.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn run_hlo_module() -> Command {
    Command::new(env!("CARGO_BIN_EXE_run_hlo_module"))
}

/// `hlo-opt` built beside this binary (cargo) or in its Bazel package.
fn hlo_opt() -> Option<Command> {
    let here = PathBuf::from(env!("CARGO_BIN_EXE_run_hlo_module"));
    let beside = here.parent()?.join("hlo-opt");
    beside.is_file().then(|| Command::new(beside))
}

/// A fresh scratch folder for one test, removed when dropped.
struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn scratch(name: &str) -> Scratch {
    let dir = std::env::temp_dir().join(format!("bad_input_{name}_{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    Scratch(dir)
}

fn write(dir: &Path, text: &str) -> PathBuf {
    let path = dir.join("m.hlo");
    std::fs::write(&path, text).unwrap();
    path
}

/// Exit 1 with every `needle` on stderr, no panic, nothing in `out`.
fn assert_refused(output: &Output, needles: &[&str], out: &Path) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    for needle in needles {
        assert!(stderr.contains(needle), "missing {needle:?} in: {stderr}");
    }
    let written: Vec<_> = std::fs::read_dir(out)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(
        written
            .iter()
            .all(|p| p.extension().is_some_and(|e| e == "hlo")),
        "output written: {written:?}"
    );
}

const HUGE_PARTITIONS: &str = "HloModule m, num_partitions=999999999991

ENTRY %e (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0), sharding={devices=[2]<=[2]}
  ROOT %n = f32[8]{0} negate(%p), sharding={devices=[2]<=[2]}
}
";

#[test]
fn num_partitions_beyond_the_device_limit() {
    let dir = scratch("partitions");
    let m = write(&dir, HUGE_PARTITIONS);
    let out = dir.join("out");
    let o = run_hlo_module()
        .arg(&m)
        .args(["--partition", "--output"])
        .arg(&out)
        .output()
        .unwrap();
    assert_refused(&o, &["num_partitions=999999999991 is out of range"], &out);
    if let Some(mut opt) = hlo_opt() {
        let o = opt
            .arg(&m)
            .args(["--passes=sharding-propagation,spmd-partitioning", "-o"])
            .arg(dir.join("out.txt"))
            .output()
            .unwrap();
        assert_refused(&o, &["num_partitions=999999999991 is out of range"], &out);
        assert!(!dir.join("out.txt").exists());
    }
}

const MESH_GROUPS: &str = "HloModule m, num_partitions=8

%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

ENTRY %e (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  ROOT %r = f32[8]{0} all-reduce(%p), channel_id=1, replica_groups=mesh['x'=8,'y'=AXIS] {'x'}, use_global_device_ids=true, to_apply=%sum
}
";

#[test]
fn mesh_replica_groups_of_four_billion_devices() {
    let dir = scratch("mesh");
    let m = write(&dir, &MESH_GROUPS.replace("AXIS", "4294967296"));
    let out = dir.join("out");
    let o = run_hlo_module()
        .arg(&m)
        .args(["--devices", "8", "--output"])
        .arg(&out)
        .output()
        .unwrap();
    assert_refused(
        &o,
        &["m.hlo:11:8: e/r: replica_groups:", "over the limit"],
        &out,
    );
    if let Some(mut opt) = hlo_opt() {
        let o = opt.arg(&m).arg("--schedule-report").output().unwrap();
        assert_refused(&o, &["m.hlo:11:8: e/r: replica_groups:"], &out);
    }
}

#[test]
fn zero_mesh_axis_in_replica_groups() {
    let dir = scratch("zero_axis");
    let m = write(&dir, &MESH_GROUPS.replace("AXIS", "0"));
    let out = dir.join("out");
    let o = run_hlo_module()
        .arg(&m)
        .args(["--devices", "8", "--output"])
        .arg(&out)
        .output()
        .unwrap();
    assert_refused(&o, &["m.hlo:11:8: e/r:", "non-positive size 0"], &out);
}

const HUGE_PARAMETER: &str = "HloModule m

ENTRY %e (p: f32[4294967296]) -> f32[4294967296] {
  %p = f32[4294967296]{0} parameter(0)
  ROOT %n = f32[4294967296]{0} negate(%p)
}
";

#[test]
fn a_parameter_too_large_to_allocate() {
    let dir = scratch("parameter");
    let m = write(&dir, HUGE_PARAMETER);
    let out = dir.join("out");
    let o = run_hlo_module()
        .arg(&m)
        .args(["--memory-limit", "1GiB", "--output"])
        .arg(&out)
        .output()
        .unwrap();
    assert_refused(
        &o,
        &["parameter 0 (%p): f32[4294967296] needs 16.0 GiB (17179869184 bytes), the memory limit is 1.0 GiB"],
        &out,
    );
}

const HUGE_INTERMEDIATE: &str = "HloModule m

%sum (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}

ENTRY %e (p: f32[]) -> f32[] {
  %p = f32[] parameter(0)
  %b = f32[1099511627776,4]{1,0} broadcast(%p), dimensions={}
  %zero = f32[] constant(0)
  ROOT %r = f32[] reduce(%b, %zero), dimensions={0,1}, to_apply=%sum
}
";

#[test]
fn an_intermediate_too_large_to_allocate() {
    let dir = scratch("intermediate");
    let m = write(&dir, HUGE_INTERMEDIATE);
    let out = dir.join("out");
    // The default limit is the machine's available memory; 16 TiB is more.
    let o = run_hlo_module()
        .arg(&m)
        .arg("--output")
        .arg(&out)
        .output()
        .unwrap();
    assert_refused(
        &o,
        &["instruction %b: f32[1099511627776,4] needs 16.0 TiB"],
        &out,
    );
    let o = run_hlo_module()
        .arg(&m)
        .args(["--memory-limit", "1MiB", "--output"])
        .arg(&out)
        .output()
        .unwrap();
    assert_refused(&o, &["the memory limit is 1.0 MiB (1048576 bytes)"], &out);
}

#[test]
fn a_real_module_over_the_budget_fails_fast() {
    let Some(llama) = xla_test_paths::shared_path("xla-hlo/hlo_llama31_70b_bf16_16x8.hlo") else {
        eprintln!("note: ../shared/xla-hlo is absent; skipping the Llama 3.1 70B budget check");
        return;
    };
    let start = std::time::Instant::now();
    let o = run_hlo_module()
        .arg(&llama)
        .args(["--memory-limit", "1GiB"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("parameter 2 (%param.17): f32[128,80,28672] needs 1.1 GiB"),
        "{stderr}"
    );
    assert!(start.elapsed().as_secs_f64() < 5.0, "{:?}", start.elapsed());
}
