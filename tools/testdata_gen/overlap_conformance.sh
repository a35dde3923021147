#!/usr/bin/env bash
# Every stored case (testdata/cases and ../shared/corpus/cases) through
# `run_hlo_module --partition` on 8 loopback devices with the overlap passes
# on (windowed einsum at threshold 0, one way and both ways round the ring,
# then decompose-collectives; and one way with combine-collectives after),
# compared with XLA's outputs at the case's
# tolerances (case.json rtol/atol, 1e-5 otherwise). Prints each failure and
# the counts; exit 1 on any failure.
set -uo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -q -p run-hlo-module
RUN=target/release/run_hlo_module
ok=0; bad=0; skipped=0
dirs=(testdata/cases/*/)
[ -d ../shared/corpus/cases ] && dirs+=(../shared/corpus/cases/*/)
for d in "${dirs[@]}"; do
  if [ ! -f "$d/input.hlo" ] || [ ! -d "$d/args" ] || [ ! -d "$d/expected" ]; then
    skipped=$((skipped + 1)); continue
  fi
  read -r rtol atol < <(python3 -c "import json,sys; c=json.load(open(sys.argv[1])); print(c.get('rtol', 1e-5), c.get('atol', 1e-5))" "$d/case.json")
  for extra in "" --windowed-einsum-bidirectional --combine-collectives; do
    out=$("$RUN" "$d/input.hlo" --partition --args "$d/args" --expected "$d/expected" \
      --rtol "$rtol" --atol "$atol" --windowed-einsum-threshold-mib 0 --decompose-collectives \
      $extra 2>&1)
    if [ $? -eq 0 ] && grep -q '"all_matched":true' <<<"$out"; then
      ok=$((ok + 1))
    else
      bad=$((bad + 1)); echo "FAIL $d $extra: $(tail -c 300 <<<"$out")"
    fi
  done
done
echo "overlap conformance: $ok runs matched XLA's outputs, $bad failed, $skipped cases without inputs skipped"
[ "$bad" -eq 0 ]
