#!/usr/bin/env bash
# Prints every HLO file we have (../shared/corpus, ../shared/xla-hlo,
# testdata/cases) through our parser and printer (`hlo-opt FILE -o OUT`), and
# testdata's partitioned programs with windowed einsum loops and with
# collectives decomposed and combined, then checks that XLA's own parser (jaxlib) accepts
# every printed file.
# Skips with a message when jaxlib is not installed. Exit 1 on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! python3 -c 'import jax' >/dev/null 2>&1; then
  echo "check_printed_hlo_with_xla: jaxlib not installed: skipping"
  exit 0
fi

cargo build --release -q -p hlo-opt
HLO_OPT=target/release/hlo-opt
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

files=()
[ -d ../shared ] && while IFS= read -r f; do files+=("$f"); done < <(find ../shared/corpus ../shared/xla-hlo -name '*.hlo' | sort)
while IFS= read -r f; do files+=("$f"); done < <(find testdata/cases -name '*.hlo' | sort)
[ -d ../shared ] || echo "note: ../shared not found; checking testdata only"

list="$out/list.txt"
i=0
for f in "${files[@]}"; do
  i=$((i + 1))
  dst="$out/$i.hlo"
  "$HLO_OPT" "$f" -o "$dst"
  echo "$dst" >> "$list"
done
# The partitioned programs of testdata's cases with every legal dot windowed
# (collective matmul loops: while, collective-permute, dynamic slices), one
# way and both ways round the ring.
windowed=0
while IFS= read -r f; do
  for direction in "" --windowed-einsum-bidirectional; do
    i=$((i + 1))
    dst="$out/$i.hlo"
    "$HLO_OPT" "$f" --passes=sharding-propagation,spmd-partitioning,windowed-einsum \
      --windowed-einsum-threshold-mib 0 $direction -o "$dst"
    if grep -q windowed_einsum_body "$dst"; then
      echo "$dst" >> "$list"
      windowed=$((windowed + 1))
    fi
  done
done < <(find testdata/cases -name input.hlo | sort)
# The same programs and the tensor-parallel overlap cases with collectives
# decomposed and combined (decompose-collectives and combine-collectives
# after windowed einsum), where either changed anything.
decomposed=0
combined=0
while IFS= read -r f; do
  i=$((i + 1))
  dst="$out/$i.hlo"
  log=$(RUST_LOG=info "$HLO_OPT" "$f" \
    --passes=sharding-propagation,spmd-partitioning,windowed-einsum,decompose-collectives,combine-collectives \
    --windowed-einsum-threshold-mib 0 --cost-model analytical -o "$dst" 2>&1)
  split=$(grep -c 'decompose-collectives: [1-9][0-9]* of' <<<"$log" || true)
  joined=$(grep -c 'combine-collectives: [1-9][0-9]* of' <<<"$log" || true)
  if [ "$split" -gt 0 ] || [ "$joined" -gt 0 ]; then
    echo "$dst" >> "$list"
    [ "$split" -gt 0 ] && decomposed=$((decomposed + 1))
    [ "$joined" -gt 0 ] && combined=$((combined + 1))
  fi
done < <(find testdata/cases -name input.hlo | sort; find testdata/overlap_cases -name '*.hlo' | sort)
total=$(wc -l < "$list")
echo "printed $total files with hlo-opt ($windowed windowed-einsum programs, $decomposed with collectives decomposed, $combined combined); checking them with XLA's parser"
if python3 tools/check_xla_parses.py --from-list "$list" > "$out/result.txt"; then
  echo "XLA's parser accepted all $total printed files"
else
  grep -v '^OK' "$out/result.txt" || true
  echo "XLA's parser rejected some printed files" >&2
  exit 1
fi
