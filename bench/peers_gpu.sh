#!/usr/bin/env bash
# The DSA top-k peers on a GPU host in one run: install the zarr wheels from .whl/, build the
# bundled kernels, run the GPU tests named in $PLAIN_TESTS (before the peers are importable: the SGLang
# capture tests bring their own SGLang tree), unpack the peers staged in .peers/ (by
# shared/gpu/peer-kernels; kept in /tmp/peers between runs), run the peers' GPU tests, then
# bench/peers.py for the suites in $SUITES at $SCALE (none: no replay). The regression check of the bundled
# kernels (bench/regress.py) runs after the build on every run. $PLAIN_TESTS: test paths or node
# ids, one pytest each, with $PYTEST_ARGS (e.g. -m gpu: only a file's GPU tests).
#   SUITES=probe,decode SCALE=full bash bench/peers_gpu.sh      (.peers and .whl in the tree)
# Everything is written to $OUT as it is made (a run cut short keeps what it finished): the build and
# test logs, JUnit files, and peers.py's JSON, commands, versions and PEERS.md. cuDNN's indexer top-k is
# too large to travel with .peers: staging/stage_cudnn.sh's runs put it in /tmp/cudnn first, read here.
# Releases side by side: every folder under $STAGED (default /tmp/staged) holding one release of an
# adapter's package (the package beside its *.dist-info) gives each adapter that takes it a column of its
# own (bench/peers.py --staged; catalog.columns): vLLM 0.33.0 and 0.34.0 as staging/stage_vllm.sh's runs
# just before lay them out (/tmp/staged/vllm-VERSION), FlashInfer 0.7.4 as staging/stage_flashinfer.sh's
# does (/tmp/staged/flashinfer-0.7.4; a .flashinfer-*/N carried with .peers is unpacked here, after it),
# or another release of a peer laid out the same way. .peers' packages are named
# (staging/name_releases.py) so that the installed release keeps its column beside a staged one of the
# same package.
# DETERMINISM=0: no reruns under load (peers.py --determinism; 5 by default). DEADLINE=S: the suite still
# running after S seconds is stopped and its report written partial; a later run with the same OUT (kept on
# the host, e.g. OUT=/tmp/peers-out, copied out at the end) resumes it, so a suite longer than one run
# (long, long-decode beside every peer) takes several.
# SKIP=PATTERNS: columns left out (peers.py --skip), e.g. SKIP='*-det*,*@vllm-0.33.0'.
# Exits 1 when any step failed (each is still tried), 3 when the set-up did.
set -uo pipefail
out=${OUT:-out/peers}
mkdir -p "$out"
failed=0
# (a run without .whl keeps what an earlier run on the same host installed in /tmp/site)
[ ! -d .whl ] && [ -d /tmp/site/zarr ] ||
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl ||
  { echo "the wheels in .whl did not install"; exit 3; }
set -f  # from here on $PLAIN_TESTS holds node ids such as test_x[cuda]: words, not patterns
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 LOGITREPLAY_CACHE=/tmp/lr-cache
cli="import sys; from logitreplay.cli import main; sys.exit(main())"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv
t0=$(date +%s)
python3 -c "$cli" build-kernels > "$out/build.log" 2>&1 || { tail -5 "$out/build.log"; exit 3; }
tail -2 "$out/build.log"
echo "build: $(( $(date +%s) - t0 )) s"
# The bundled kernels against their last committed medians, on every run (bench/regress.py).
# REGRESS=0 leaves it to another run on the same tree (bench/deepselect_gpu.sh runs it too).
if [ "${REGRESS:-1}" != 0 ]; then
  python3 bench/regress.py --out "$out/regress" > "$out/regress.log" 2>&1 || failed=1
  sed -n '/REGRESSION CHECK/,$p' "$out/regress.log"
fi
# One pytest per test item, under `timeout` (a hung test costs only its own item, and pytest's
# faulthandler prints every thread's stack after $STACKS_S s, so a hang shows where it is).
n=0
tests() {  # NAME ITEM: pytest-NAME.log and gpu-junit-NAME.xml in $out
  timeout -k 30 "${TEST_TIMEOUT:-300}" python3 -m pytest -q -p no:cacheprovider -o addopts="-ra" \
    -o faulthandler_timeout="${STACKS_S:-120}" --junitxml="$out/gpu-junit-$1.xml" ${PYTEST_ARGS:-} "$2" > "$out/pytest-$1.log" 2>&1
  local rc=$?
  [ "$rc" = 0 ] || failed=1
  echo "tests $1 ($2): exit $rc after $(( $(date +%s) - t0 )) s; $(tail -1 "$out/pytest-$1.log")"
}
for item in ${PLAIN_TESTS:-}; do
  n=$((n + 1))
  tests "$n" "$item"
done
if [ ! -f /tmp/peers/env.sh ]; then bash .peers/unpack.sh /tmp/peers > "$out/unpack.log" 2>&1 || { cat "$out/unpack.log"; exit 3; }; fi
. /tmp/peers/env.sh
# FlashInfer releases staged by staging/stage_flashinfer.sh and carried here (.flashinfer-*/N), unpacked into
# $STAGED after .peers, whose tvm-ffi they import
for u in $(find . -maxdepth 3 -path './.flashinfer-*/*/unpack.sh' | sort); do
  bash "$u" >> "$out/unpack.log" 2>&1 || { failed=1; echo "$u failed:"; tail -3 "$out/unpack.log"; }
done
echo "staged under ${STAGED:-/tmp/staged}: $(ls "${STAGED:-/tmp/staged}" 2> /dev/null | tr '\n' ' ')"
export LOGITREPLAY_STAGED=${STAGED:-/tmp/staged}  # the GPU tests verify each staged release's columns too
# cuDNN's indexer top-k, where the runs just before unpacked staging/stage_cudnn.sh's parts into /tmp/cudnn
if [ -f /tmp/cudnn/env.sh ]; then . /tmp/cudnn/env.sh; else echo "cudnn: not unpacked in /tmp/cudnn (staging/stage_cudnn.sh)"; fi
# upstream DeepSelect (deepselect-upstream), prebuilt for sm_90a, where the tree carries shared/gpu/deepselect
# as .deepselect (its README)
ds_tar=$(find .deepselect/prebuilt -name 'deep_select-*-sm90a.tar.xz' 2> /dev/null | head -1)
if [ -n "$ds_tar" ]; then
  mkdir -p /tmp/dsdest && tar -xJf "$ds_tar" -C /tmp/dsdest &&
    export PYTHONPATH=$PYTHONPATH:/tmp/dsdest || echo "deepselect: .deepselect/prebuilt did not unpack"
elif [ -d /tmp/dsdest/deep_select ]; then export PYTHONPATH=$PYTHONPATH:/tmp/dsdest  # an earlier run's
else echo "deepselect: no .deepselect/prebuilt (shared/gpu/deepselect's README)"; fi
export PYTHONPATH=/tmp/site:$PYTHONPATH:$PWD
# every folder a peer's package is imported from, so that each report records the release that ran
# (environment.peer_versions reads the distributions' metadata: SGLang's sources and upstream DeepSelect's
# prebuilt folder come without any)
for d in /tmp/peers/site /tmp/peers/sglang /tmp/dsdest; do
  if [ -d "$d" ]; then python3 staging/name_releases.py "$d"; fi
done > "$out/releases.log" 2>&1 || echo "naming the peers' releases failed"
echo "installed: $(tr '\n' ';' < "$out/releases.log")"
if [ "${TESTS:-1}" != 0 ]; then tests peers tests/gpu/test_gpu_peers.py; fi
[ "${SUITES:-}" = none ] && { echo "total: $(( $(date +%s) - t0 )) s"; exit "$failed"; }
python3 bench/peers.py --out "$out" --suites "${SUITES:-probe,seed-controls}" --scale "${SCALE:-full}" \
  --staged "${STAGED:-/tmp/staged}" \
  ${ROUNDS:+--rounds $ROUNDS} ${WARMUP:+--warmup $WARMUP} ${DEADLINE:+--deadline $DEADLINE} \
  ${DETERMINISM:+--determinism $DETERMINISM} ${SKIP:+--skip "$SKIP"} --md "$out/PEERS.md" \
  > "$out/peers.log" 2>&1 || failed=1
grep -v "^\s*$" "$out/peers.log" | tail -40
echo "total: $(( $(date +%s) - t0 )) s"
exit "$failed"
