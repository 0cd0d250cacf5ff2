#!/usr/bin/env bash
# The DSA top-k peers on the GPU machine in one call: install the zarr wheels from .whl/, build the
# bundled kernels, run the GPU tests named in $PLAIN_TESTS (before the peers are importable: the SGLang
# capture tests bring their own SGLang tree), unpack the peers staged in .peers/ (by
# shared/gpu/peer-kernels; kept in /tmp/peers between calls), run the peers' GPU tests, then
# bench/peers.py for the suites in $SUITES at $SCALE. $PLAIN_TESTS: test paths or node ids, one pytest each.
#   SUITES=probe,decode SCALE=full bash bench/peers_gpu.sh      (carry .peers and .whl)
# Everything is written to $OUT as it is made (a call cut short keeps what it finished): the build and
# test logs, JUnit files, and peers.py's JSON, commands, versions and PEERS.md. cuDNN's indexer top-k is
# too large to travel with .peers: bench/stage_cudnn.sh's calls put it in /tmp/cudnn first, read here.
set -uo pipefail
out=${OUT:-out/peers}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 LOGITREPLAY_CACHE=/tmp/lr-cache
cli="import sys; from logitreplay.cli import main; sys.exit(main())"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv
t0=$(date +%s)
python3 -c "$cli" build-kernels > "$out/build.log" 2>&1; tail -2 "$out/build.log"
echo "build: $(( $(date +%s) - t0 )) s"
# One pytest per item of $PLAIN_TESTS, each under `timeout` (a hung test costs only its own item, and
# pytest's faulthandler prints every thread's stack after $STACKS_S s, so a hang shows where it is).
n=0
for item in ${PLAIN_TESTS:-}; do
  n=$((n + 1))
  timeout "${TEST_TIMEOUT:-300}" python3 -m pytest -q -p no:cacheprovider -o addopts="-ra" \
    -o faulthandler_timeout="${STACKS_S:-120}" --junitxml="$out/gpu-junit-$n.xml" "$item" > "$out/pytest-$n.log" 2>&1
  rc=$?
  echo "tests $n ($item): exit $rc after $(( $(date +%s) - t0 )) s; $(tail -1 "$out/pytest-$n.log")"
done
if [ ! -f /tmp/peers/env.sh ]; then bash .peers/unpack.sh /tmp/peers > "$out/unpack.log" 2>&1 || { cat "$out/unpack.log"; exit 3; }; fi
. /tmp/peers/env.sh
# cuDNN's indexer top-k, where the calls just before unpacked bench/stage_cudnn.sh's parts into /tmp/cudnn
if [ -f /tmp/cudnn/env.sh ]; then . /tmp/cudnn/env.sh; else echo "cudnn: not unpacked in /tmp/cudnn (bench/stage_cudnn.sh)"; fi
export PYTHONPATH=/tmp/site:$PYTHONPATH:$PWD
if [ "${TESTS:-1}" != 0 ]; then
  python3 -m pytest -q -p no:cacheprovider -o addopts="-ra" --junitxml="$out/gpu-peers-junit.xml" \
    tests/gpu/test_gpu_peers.py 2>&1 | tee "$out/pytest-peers.log" | tail -25
  echo "peer tests: $(( $(date +%s) - t0 )) s"
fi
python3 bench/peers.py --out "$out" --suites "${SUITES:-probe,seed-controls}" --scale "${SCALE:-full}" \
  ${ROUNDS:+--rounds $ROUNDS} ${WARMUP:+--warmup $WARMUP} ${DEADLINE:+--deadline $DEADLINE} --md "$out/PEERS.md" 2>&1 | tee "$out/peers.log" | grep -v "^\s*$" | tail -40
echo "total: $(( $(date +%s) - t0 )) s"
