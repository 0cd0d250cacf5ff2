#!/usr/bin/env bash
# deepselect before/after on a GPU host in one run: the variants prepared by bench/deepselect_ab.py
# (.ds-variants/) built and replayed side by side, with upstream DeepSelect, on the suites in $SUITES
# (SUITE or SUITE:REGEX, the regex picking its cases; default: seed-controls, indexer, the stress
# suite's flooded bins, seed-controls-bf16 and indexer-decode), each at full scale under the default
# protocol; then the table. The zarr wheels come from .whl/, upstream DeepSelect from
# .deepselect/prebuilt (shared/gpu/deepselect's README), unpacked into /tmp/dsdest.
#   bash bench/deepselect_gpu.sh                        (after deepselect_ab.py prepare on the checkout)
# Writes to $OUT: the build log, one replay JSON and log per suite, table.txt, and ab.tar.gz of them all
# (remade after each suite, so a run cut short keeps what it finished). Exits 1 when a step failed.
set -uo pipefail
out=${OUT:-out/deepselect-ab}
mkdir -p "$out"
failed=0
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl ||
  { echo "the wheels in .whl did not install"; exit 3; }
mkdir -p /tmp/dsdest
tar -xJf .deepselect/prebuilt/deep_select-*-sm90a.tar.xz -C /tmp/dsdest || { echo "no upstream DeepSelect"; exit 3; }
export PYTHONPATH=/tmp/site:/tmp/dsdest:$PWD PYTHONUNBUFFERED=1 LOGITREPLAY_CACHE=/tmp/lr-cache
cli="import sys; from logitreplay.cli import main; sys.exit(main())"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv
t0=$(date +%s)
python3 bench/deepselect_ab.py build > "$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 3; }
echo "build: $(( $(date +%s) - t0 )) s"
selectors=$(for d in .ds-variants/*/; do n=$(basename "$d"); printf 'bench.deepselect_ab:%s,' "$n"; done)
selectors="${selectors}${EXTRA_SELECTORS:-}deepselect-upstream"
pack() { (cd "$out" && tar -czf ab.tar.gz --exclude ab.tar.gz ./*); }
for item in ${SUITES:-seed-controls indexer stress:bin-flood seed-controls-bf16 indexer-decode}; do
  suite=${item%%:*}
  match=()
  [ "$item" != "$suite" ] && match=(--match "${item#*:}")
  timeout -k 10 "${SUITE_TIMEOUT:-240}" python3 -c "$cli" replay --device cuda --suite "$suite" --scale full \
    --selectors "$selectors" "${match[@]}" --json "$out/$suite.json" > "$out/$suite.log" 2>&1
  rc=$?
  [ "$rc" = 0 ] || failed=1
  echo "$suite: exit $rc after $(( $(date +%s) - t0 )) s"
  pack
done
python3 bench/deepselect_ab.py table "$out"/*.json --base "${BASE:-deepselect@pre-rebet}" | tee "$out/table.txt"
pack
echo "total: $(( $(date +%s) - t0 )) s"
exit "$failed"
