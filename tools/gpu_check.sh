#!/usr/bin/env bash
# The CUDA backend's device check: one call on the GPU machine, under 5
# minutes. The GPU machine has no Rust toolchain, so:
#
#   on the CPU machine:  tools/gpu_check.sh --build
#       builds the GPU test binaries and run_hlo_module (release, features
#       cuda + nccl, symbols stripped) into target/gpu-check/ (carry that
#       folder to the GPU machine);
#   on the GPU machine:  tools/gpu_check.sh
#       puts the CUDA 13 / NCCL / pip library folders on LD_LIBRARY_PATH
#       (with unversioned libnvrtc.so / libcublas.so / libnccl.so links where
#       only versioned files exist), then runs
#         1. the CUDA backend's CPU unit tests (planner, codegen, host-built
#            kernels, typed errors);
#         2. tests/cuda.rs on the GPU(s): small modules against the
#            interpreter, an async all-reduce through a single-rank NCCL
#            communicator on the communication stream, every testdata (and
#            ../shared/corpus, if present) case against XLA's outputs, the
#            global input.hlo on one GPU and our partitioned program on its
#            devices (NCCL between GPUs when there are as many GPUs as
#            devices, host collectives between devices sharing a GPU
#            otherwise), bf16 GEMM TFLOP/s, device copy GB/s, and the
#            perf_transformer_block step beside its roofline;
#         3. perf_transformer_block's outputs against its stored summary
#            (run_hlo_module --case ... --backend cuda);
#       and prints a table (case, global, partitioned, times) and the
#       figures, exiting non-zero on any failure, on a skipped GPU test, on
#       bf16 GEMM under 80% of 787 TFLOP/s, or on perf_transformer_block over
#       1.5x its roofline.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
out=target/gpu-check

if [[ ${1:-} == --build ]]; then
  set -e
  export CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_PROFILE_RELEASE_STRIP=symbols
  mkdir -p "$out"
  cargo test --release -p xla-runtime --features cuda,nccl --no-run --message-format=json \
    --lib --test cuda \
    | python3 -c '
import json, sys, shutil
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        name = m["target"]["name"]
        if m["target"]["kind"] == ["lib"]: name = "runtime_lib"
        shutil.copy(m["executable"], sys.argv[1] + "/" + name)
        print("built", sys.argv[1] + "/" + name)
' "$out"
  cargo build --release -p run-hlo-module --features cuda,nccl
  cp target/release/run_hlo_module "$out/run_hlo_module"
  du -sh "$out"
  exit 0
fi

for b in runtime_lib cuda run_hlo_module; do
  if [[ ! -x $out/$b ]]; then
    echo "gpu_check: $out/$b missing: run 'tools/gpu_check.sh --build' on the CPU machine and carry $out" >&2
    exit 2
  fi
done

# Libraries: CUDA 13 toolkit, system NCCL and pip wheels; unversioned links
# in a shim folder.
shim=$(mktemp -d)
libdirs=()
for d in /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-13.0/targets/x86_64-linux/lib \
         /usr/local/cuda/lib64 /usr/lib/x86_64-linux-gnu; do
  [[ -d $d ]] && libdirs+=("$d")
done
if command -v python3 >/dev/null; then
  sp=$(python3 -c 'import site; print(site.getsitepackages()[0])' 2>/dev/null || true)
  for d in "$sp"/nvidia/cu13/lib "$sp"/nvidia/cublas/lib "$sp"/nvidia/cuda_nvrtc/lib "$sp"/nvidia/nccl/lib; do
    [[ -d $d ]] && libdirs+=("$d")
  done
fi
for lib in nvrtc cublas cublasLt nccl; do
  for d in "${libdirs[@]}"; do
    f=$(ls "$d"/lib$lib.so.[0-9]* 2>/dev/null | head -1)
    if [[ -n $f && ! -e $shim/lib$lib.so && ! -e $d/lib$lib.so ]]; then ln -s "$f" "$shim/lib$lib.so"; fi
  done
done
LD_LIBRARY_PATH="$shim:$(IFS=:; echo "${libdirs[*]}"):${LD_LIBRARY_PATH:-}"
export LD_LIBRARY_PATH XLA_RS_CHECKOUT="$root"
echo "== libraries: shim $(ls "$shim" | tr '\n' ' ')"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader

log=$(mktemp)
status=0
echo "== 1. CPU unit tests of the CUDA backend"
timeout 60 "$out/runtime_lib" cuda:: 2>&1 | tail -2 || status=1
echo "== 2. tests/cuda.rs on the GPU(s)"
timeout 210 "$out/cuda" --nocapture --test-threads 1 >"$log" 2>&1 || status=1
grep -v '^CUDA-' "$log" | grep -v '^$' | tail -25

echo
echo "== table: every case on --backend cuda (global input.hlo on one GPU; our partitioned program on its devices; ms of one run incl. transfers)"
printf '%-48s %-10s %10s   %-10s %10s\n' case global ms partitioned ms
python3 - "$log" <<'EOF'
import sys, collections
rows = collections.OrderedDict()
for line in open(sys.argv[1], errors="replace"):
    if not line.startswith("CUDA-CASE "):
        continue
    parts = line.split(None, 5)
    if len(parts) < 5:
        continue
    _, mode, name, res, ms = parts[:5]
    rows.setdefault(name, {})[mode] = (res, ms)
count = collections.Counter()
for name, r in rows.items():
    g = r.get("global", ("-", "-"))
    p = r.get("partitioned", ("-", "-"))
    count["global " + g[0]] += 1
    count["partitioned " + p[0]] += 1
    print(f"{name:48} {g[0]:10} {g[1]:>10}   {p[0]:10} {p[1]:>10}")
print("summary:", ", ".join(f"{k}: {v}" for k, v in sorted(count.items())))
EOF
grep '^CUDA-CASE .* FAIL' "$log" | head -20
if grep -q '^CUDA-CASE .* FAIL' "$log"; then status=1; fi
grep -E '^CUDA-(GEMM|COPY|PERF)' "$log"
if grep -q 'skipping CUDA test' "$log"; then
  echo "FAIL: the CUDA tests skipped (no device or library): $(grep -m1 'skipping CUDA test' "$log")"
  status=1
fi
python3 - "$log" <<'EOF' || status=1
import re, sys
text = open(sys.argv[1], errors="replace").read()
ok = True
m = re.search(r"CUDA-GEMM bf16 8192\^3 -> bf16: ([0-9.]+) TFLOP/s", text)
if m and float(m.group(1)) < 0.8 * 787:
    print(f"FAIL: bf16 GEMM {m.group(1)} TFLOP/s is under 80% of 787"); ok = False
m = re.search(r"CUDA-PERF perf_transformer_block step .* \(([0-9.]+)x\)", text)
if m and float(m.group(1)) > 1.5:
    print(f"FAIL: perf_transformer_block is {m.group(1)}x its roofline (goal: within 1.5x)"); ok = False
sys.exit(0 if ok else 1)
EOF

perf=${XLA_RS_SHARED:-$root/../shared}/corpus/cases/perf_transformer_block
if [[ -d $perf ]]; then
  echo "== 3. perf_transformer_block outputs on --backend cuda against the stored summary"
  if timeout 60 "$out/run_hlo_module" --case "$perf" --backend cuda >"$log" 2>&1 && grep -q '"all_matched":true' "$log"; then
    echo "perf_transformer_block: MATCH"
  else
    echo "perf_transformer_block: FAIL"; tail -5 "$log"; status=1
  fi
fi
rm -rf "$shim" "$log"
echo "gpu_check: exit $status"
exit $status
