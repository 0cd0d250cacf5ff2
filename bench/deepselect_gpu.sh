#!/usr/bin/env bash
# deepselect before/after on a GPU host in one run: the variants prepared by bench/deepselect_ab.py
# (.ds-variants/) built and replayed side by side, with upstream DeepSelect, on the suites in $SUITES
# (SUITE or SUITE:REGEX, the regex picking its cases; default: seed-controls, indexer, the stress
# suite's flooded bins, seed-controls-bf16 and indexer-decode), each at full scale under the default
# protocol; then the table. Before the replays: the regression check of the tree's bundled kernels
# (bench/regress.py) and the GPU tests named in $GPU_TESTS (paths, one pytest each, on the tree's
# kernels). The zarr wheels come from .whl/, upstream DeepSelect from .deepselect/prebuilt
# (shared/gpu/deepselect's README), unpacked into /tmp/dsdest.
#   python bench/deepselect_ab.py prepare pre-rebet=08912d3^ head=main tree=.   (on the checkout)
#   GPU_TESTS="tests/gpu/test_work_record.py tests/gpu/test_deepselect.py" bash bench/deepselect_gpu.sh
# Everything is written to $WORK (the build, regression and test logs, JUnit files, one replay JSON and
# log per suite, table.txt) and packed into $OUT/ab.tar.gz after each step, so a run cut short keeps what
# it finished; $OUT also gets table.txt. Exits 1 when a step failed or a kernel got slower.
set -uo pipefail
out=${OUT:-out/deepselect-ab}
work=${WORK:-/tmp/deepselect-ab}
mkdir -p "$out" "$work"
failed=0
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl ||
  { echo "the wheels in .whl did not install"; exit 3; }
mkdir -p /tmp/dsdest
tar -xJf .deepselect/prebuilt/deep_select-*-sm90a.tar.xz -C /tmp/dsdest || { echo "no upstream DeepSelect"; exit 3; }
export PYTHONPATH=/tmp/site:/tmp/dsdest:$PWD PYTHONUNBUFFERED=1 LOGITREPLAY_CACHE=/tmp/lr-cache
cli="import sys; from logitreplay.cli import main; sys.exit(main())"
pack() { tar -czf "$out/ab.tar.gz" -C "$work" .; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv
t0=$(date +%s)
python3 bench/deepselect_ab.py build > "$work/build.log" 2>&1 || { tail -20 "$work/build.log"; exit 3; }
echo "variants built: $(( $(date +%s) - t0 )) s"
python3 bench/regress.py --out "$work/regress" > "$work/regress.log" 2>&1
rc=$?
[ "$rc" = 1 ] && failed=1
echo "regression check: exit $rc after $(( $(date +%s) - t0 )) s"
pack
for t in ${GPU_TESTS:-}; do
  name=$(basename "$t" .py)
  timeout -k 10 "${TEST_TIMEOUT:-300}" python3 -m pytest -q -p no:cacheprovider -o addopts="-ra" \
    --junitxml="$work/gpu-junit-$name.xml" "$t" > "$work/pytest-$name.log" 2>&1
  rc=$?
  [ "$rc" = 0 ] || failed=1
  echo "tests $t: exit $rc after $(( $(date +%s) - t0 )) s; $(tail -1 "$work/pytest-$name.log")"
  pack
done
selectors=$(for d in .ds-variants/*/; do n=$(basename "$d"); printf 'bench.deepselect_ab:%s,' "$n"; done)
selectors="${selectors}${EXTRA_SELECTORS:-}deepselect-upstream"
for item in ${SUITES:-seed-controls indexer stress:bin-flood seed-controls-bf16 indexer-decode}; do
  suite=${item%%:*}
  match=()
  [ "$item" != "$suite" ] && match=(--match "${item#*:}")
  timeout -k 10 "${SUITE_TIMEOUT:-240}" python3 -c "$cli" replay --device cuda --suite "$suite" --scale full \
    --selectors "$selectors" "${match[@]}" --json "$work/$suite.json" > "$work/$suite.log" 2>&1
  rc=$?
  [ "$rc" = 0 ] || failed=1
  echo "$suite: exit $rc after $(( $(date +%s) - t0 )) s"
  pack
done
python3 bench/deepselect_ab.py table "$work"/*.json --base "${BASE:-deepselect@pre-rebet}" | tee "$work/table.txt"
cp "$work/table.txt" "$out/"
pack
echo "total: $(( $(date +%s) - t0 )) s"
exit "$failed"
