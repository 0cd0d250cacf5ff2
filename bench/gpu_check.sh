#!/usr/bin/env bash
# Everything a GPU is needed for, in one call: the kernel build (cold, then cached), the regression check
# of the bundled kernels against their last committed medians (bench/regress.py, in every mode), the gpu
# tests, and the full-scale control-suite replays of bench/replay_controls.py, whose table is printed last.
# Usage, from the repository root on a CUDA machine:  bench/gpu_check.sh [quick]
#   quick: the build, the regression check, native's tests and one replay of reference and native only.
# Exits with the regression check's status (1: a kernel got slower, 2: no baseline for this GPU).
set -uo pipefail
out=${OUT:-out/gpu_check}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 LOGITREPLAY_CACHE=${LOGITREPLAY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/logitreplay}
cli="import sys; from logitreplay.cli import main; sys.exit(main())"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv
python3 bench/build_time.py 2>&1 | tee "$out/build.log"
python3 -c "$cli" build-kernels >/dev/null
python3 bench/regress.py --out "$out/regress" 2>&1 | tee "$out/regress.log"
regress=${PIPESTATUS[0]}
if [ "${1:-}" = quick ]; then
  python3 -m pytest -q -p no:cacheprovider tests/gpu -k "not deepselect" 2>&1 | tee "$out/pytest.log" | tail -30
  python3 -c "$cli" replay --device cuda --suite seed-controls --scale full --selectors reference,native \
    --json "$out/events-1.json"
else
  python3 -m pytest -q -p no:cacheprovider tests/gpu 2>&1 | tee "$out/pytest.log" | tail -30
  python3 bench/replay_controls.py --out "$out" -- --recommend 2>&1 | tee "$out/replay.log"
fi
sed -n '/REGRESSION CHECK/,$p' "$out/regress.log"  # again, after the long output above
exit "$regress"
