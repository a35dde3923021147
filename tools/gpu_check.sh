#!/usr/bin/env bash
# The CUDA backend's device check (issue 8), one call on the GPU machine,
# well under 5 minutes. The GPU machine has no Rust toolchain, so:
#
#   on the CPU machine:  tools/gpu_check.sh --build
#       builds the CUDA test binaries (release, feature `cuda`, no debug info)
#       into target/gpu-check/ (carry that folder to the GPU machine);
#   on the GPU machine:  tools/gpu_check.sh
#       puts the CUDA 13 / pip library folders on LD_LIBRARY_PATH (with
#       unversioned libnvrtc.so / libcublas.so links, which cudarc's
#       cuda-12080 candidate list needs for CUDA 13), then runs
#         1. the CUDA backend's CPU tests (planner, codegen, typed errors),
#         2. tests/cuda.rs: small modules on the GPU vs the interpreter,
#         3. every testdata (and ../shared/corpus, if present) case with
#            stored arrays: input.hlo, single device, on the GPU vs XLA's
#            expected outputs,
#       and prints a table (MATCH / UNSUPPORTED / FAIL and the time of one
#       execution, transfers included).
#
# What it cannot do yet (printed at the end too): run_hlo_module has no
# `--backend cuda`; no NCCL/multi-device (partitioned modules); no
# while/conditional, gather/scatter, reduce-window, convolution, sort; no timing against JAX/XLA on the same GPU (case times
# include host transfers). The bf16 GEMM path's TFLOP/s is printed (CUDA-GEMM).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
out=target/gpu-check

if [[ ${1:-} == --build ]]; then
  set -e
  export CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_PROFILE_RELEASE_STRIP=symbols
  mkdir -p "$out"
  cargo test --release -p xla-runtime --features cuda --no-run --message-format=json \
    --lib --test cuda --test cuda_plan \
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
  du -sh "$out"
  exit 0
fi

for b in runtime_lib cuda cuda_plan; do
  if [[ ! -x $out/$b ]]; then
    echo "gpu_check: $out/$b missing: run 'tools/gpu_check.sh --build' on the CPU machine and carry $out" >&2
    exit 2
  fi
done

# Libraries: CUDA 13 toolkit and pip wheels; unversioned links in a shim dir.
shim=$(mktemp -d)
libdirs=()
for d in /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-13.0/targets/x86_64-linux/lib \
         /usr/local/cuda/lib64 /usr/lib/x86_64-linux-gnu; do
  [[ -d $d ]] && libdirs+=("$d")
done
if command -v python3 >/dev/null; then
  sp=$(python3 -c 'import site; print(site.getsitepackages()[0])' 2>/dev/null || true)
  for d in "$sp"/nvidia/cu13/lib "$sp"/nvidia/cublas/lib "$sp"/nvidia/cuda_nvrtc/lib; do
    [[ -d $d ]] && libdirs+=("$d")
  done
fi
for lib in nvrtc cublas cublasLt; do
  for d in "${libdirs[@]}"; do
    f=$(ls "$d"/lib$lib.so.1[0-9]* 2>/dev/null | head -1)
    if [[ -n $f && ! -e $shim/lib$lib.so ]]; then ln -s "$f" "$shim/lib$lib.so"; fi
  done
done
LD_LIBRARY_PATH="$shim:$(IFS=:; echo "${libdirs[*]}"):${LD_LIBRARY_PATH:-}"
export LD_LIBRARY_PATH XLA_RS_CHECKOUT="$root"
echo "== libraries: $(ls "$shim" | tr '\n' ' ')"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader

log=$(mktemp)
status=0
echo "== 1. CPU tests of the CUDA backend (planner, codegen, typed errors)"
timeout 60 "$out/runtime_lib" cuda:: 2>&1 | tail -3 || status=1
timeout 60 "$out/cuda_plan" 2>&1 | tail -3 || status=1
echo "== 2./3. tests/cuda.rs on the GPU (small modules, unsupported-op error, corpus cases)"
timeout 200 "$out/cuda" --nocapture --test-threads 1 >"$log" 2>&1 || status=1
grep -v '^CUDA-CASE' "$log" | tail -40

echo
echo "== table: corpus cases on --backend cuda (single device, input.hlo; time of one execution incl. transfers)"
printf '%-48s %-12s %s\n' case result time
grep '^CUDA-CASE' "$log" | while read -r _ name res t rest; do
  printf '%-48s %-12s %s\n' "$name" "$res" "$t"
done
m=$(grep -c '^CUDA-CASE .* MATCH' "$log"); u=$(grep -c '^CUDA-CASE .* UNSUPPORTED' "$log"); f=$(grep -c '^CUDA-CASE .* FAIL' "$log")
grep '^CUDA-GEMM' "$log" || true
echo "summary: $m matched, $u unsupported (compile error naming the opcodes), $f failed"
if grep -q 'skipping CUDA test' "$log"; then
  echo "NOTE: the CUDA tests SKIPPED (no device or library): $(grep -m1 'skipping CUDA test' "$log")"
  status=1
fi
echo
echo "== not checked by this script yet: run_hlo_module --backend cuda (no such flag yet); NCCL collectives and"
echo "   --devices N; xla_partitioned.hlo with --devices 1; perf_transformer_block against JAX/XLA;"
echo "   while/conditional, gather/scatter, reduce-window, convolution, sort/topk (compile errors today)."
rm -rf "$shim" "$log"
exit $status
