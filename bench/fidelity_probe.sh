#!/usr/bin/env bash
# Resource usage of vLLM's top-k kernels (registers, shared memory: they set the blocks per SM) from the
# staged library's cubins, next to the bundled native's; then the concentrated seed-controls cases again.
set -uo pipefail
out=${OUT:-out/fidelity}
mkdir -p "$out"
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
lib=${VLLM_STAGED:-/tmp/staged/vllm-0.33.0}/vllm/_C_stable_libtorch.abi3.so
cuobjdump -arch sm_90 -res-usage "$lib" 2>/dev/null | grep -A1 -E "topKPerRow(Prefill|Decode)" | head -20 || echo "no cuobjdump"
cuobjdump -res-usage "$(ls -t ~/.cache/logitreplay/kernels/native-sm_90a-*.so | head -1)" 2>/dev/null | grep -A1 native | head -4
cli="import sys; from logitreplay.cli import main; sys.exit(main())"
python3 -c "$cli" replay --device cuda --suite seed-controls --scale full --case 'b-*' --case 'c-normal-c4096*' \
  --selectors native,vllm-native@$lib --json "$out/probe.json" 2>&1 | tail -12
