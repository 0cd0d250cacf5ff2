#!/usr/bin/env bash
# The vLLM-kernel fidelity work in one GPU call (after the staged library was unpacked to /tmp/vllm by the
# call before): unpack DeepSelect, install the wheels, build the kernels, run the vLLM and kernel GPU tests,
# then bench/fidelity.py for the suites named in $1 (default: seed-controls,stress; "own" for our cases,
# decode,decode-bf16 for the decode suites). $GPU_TESTS names the kernel tests (default: native's; none: no
# kernel tests).
set -uo pipefail
out=${OUT:-out/fidelity}
mkdir -p "$out" /tmp/vllm
lib=/tmp/vllm/_C_stable_libtorch.abi3.so
ds=/tmp/vllm/_deepselect_C.abi3.so
[ -f "$lib" ] || { echo "MISSING $lib: unpack it first"; exit 3; }
[ -f "$ds" ] || xz -dc .vllm/_deepselect_C.abi3.so.xz > "$ds"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
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
