#!/usr/bin/env bash
# The vLLM-kernel fidelity work in one GPU run: find vLLM's libraries, install the wheels,
# build the kernels, run the vLLM and kernel GPU tests, then bench/fidelity.py for the suites named in $1
# (default: seed-controls,stress; "own" for our cases, decode,decode-bf16 for the decode suites,
# indexer,indexer-decode for the indexer suites: the prefill ones against vLLM's prefill kernel, the
# decode ones against its decode kernels). $GPU_TESTS names the kernel tests (default: native's; none: no
# kernel tests); TESTS=0 runs no tests and builds nothing ahead (the replays build what they use).
# The libraries: _C_stable_libtorch.abi3.so and _deepselect_C.abi3.so in $VLLM_STAGED/vllm (default
# /tmp/staged/vllm-0.33.0, the release staging/stage_vllm.sh's parts unpack, one run each: bash
# .vllm-parts/N/unpack.sh), as the runs just before left them, or else decompressed there from .vllm/*.xz
# where the tree has them. Without .whl in the tree, a run uses
# what an earlier run on the same host installed in /tmp/site.
#   run 1, with .vllm-parts/1:         bash .vllm-parts/1/unpack.sh
#   run 2, with .vllm-parts/2 and .whl: bash .vllm-parts/2/unpack.sh && GPU_TESTS=none bash bench/fidelity_gpu.sh indexer,indexer-decode
set -uo pipefail
out=${OUT:-out/fidelity}
libs=${VLLM_STAGED:-/tmp/staged/vllm-0.33.0}/vllm
mkdir -p "$out" "$libs"
lib=$libs/_C_stable_libtorch.abi3.so
ds=$libs/_deepselect_C.abi3.so
for f in "$lib" "$ds"; do
  [ -f "$f" ] && continue
  xz=.vllm/$(basename "$f").xz
  [ -f "$xz" ] || { echo "MISSING $f: run bash .vllm-parts/N/unpack.sh for each part first (staging/stage_vllm.sh)," \
                      "or carry .vllm"; exit 3; }
  xz -dc "$xz" > "$f.new" && mv "$f.new" "$f" || { rm -f "$f.new"; echo "$xz did not decompress"; exit 3; }
done
[ ! -d .whl ] && [ -d /tmp/site/zarr ] ||
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl ||
  { echo "the wheels in .whl did not install"; exit 3; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 LOGITREPLAY_VLLM_LIB=$lib LOGITREPLAY_VLLM_DS_LIB=$ds
cli="import sys; from logitreplay.cli import main; sys.exit(main())"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv
if [ -n "${TESTS:-1}" ] && [ "${TESTS:-1}" != 0 ]; then
  python3 -c "$cli" build-kernels > "$out/build.log" 2>&1; tail -3 "$out/build.log"
  python3 -m pytest -q -p no:cacheprovider -x tests/gpu/test_vllm_kernels.py 2>&1 | tee "$out/pytest-vllm.log" | tail -15
  if [ "${GPU_TESTS:-}" != none ]; then
    python3 -m pytest -q -p no:cacheprovider -o addopts="" ${GPU_TESTS:-tests/gpu/test_gpu_kernels.py -k native} 2>&1 \
      | tee "$out/pytest-kernels.log" | tail -8
  fi
fi
python3 bench/fidelity.py --lib "$lib" --ds-lib "$ds" --out "$out" --md "$out/FIDELITY.md" \
  --suites "${1:-seed-controls,stress}" 2>&1 | tee "$out/fidelity.log" | grep -v "^\s*$" | tail -60
