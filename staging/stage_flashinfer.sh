#!/usr/bin/env bash
# Stage FlashInfer 0.7.4 (the `flashinfer-*` adapters of that release, `-det` included) as a staged
# release for an offline GPU host (Python 3.12, torch 2.11 cu130, CUDA 13; the tvm-ffi that .peers
# installs), beside the 0.7.2.post1 that .peers carries. Run from the project root on a machine with
# network:
#   bash staging/stage_flashinfer.sh
# It downloads two py3-none-any wheels (checked against their sha256; FLASHINFER_WHEELS=DIR takes them
# from DIR instead, checked the same way): flashinfer-python 0.7.4 (101,294,319 bytes) and nvidia-ml-py
# 13.615.71 (`pynvml`, which 0.7.4's `import flashinfer` needs and 0.7.2.post1's did not). It keeps what
# the top-k needs: every flashinfer file outside data/ (so `import flashinfer` works), data/include,
# data/cccl and data/spdlog, the data/csrc files the top-k JIT module compiles (`gen_topk_module`:
# topk.cu, cub_topk.cu, flashinfer_topk_binding.cu, flashinfer_fast_topk_clusters_binding.cu, checked
# against the wheel's flashinfer/jit/topk.py) and the two headers they include, empty data/cutlass
# include dirs; the wheel's dist-info; pynvml.py and its dist-info. A prebuilt top-k module for sm_90a
# ($PREBUILT, default ../shared/gpu/peers/flashinfer-0.7.4-topk-sm90a.so.xz where it exists; built as
# that folder's README says, with 0.7.4) goes in as data/aot/topk/topk.so, where FlashInfer loads it
# before any JIT build; without it the first call compiles the module on the host (about 25-35 minutes
# of nvcc on 2 cores: longer than one run there), so stage it with the module.
# The result, one tar.xz cut by staging/parts.sh into parts of at most $PART_MIB MiB (default 54), goes
# to .flashinfer-0.7.4/N/ (git-ignored, replaced on each run) with unpack.sh, parts.sh, SHA256SUMS and
# MANIFEST.txt. Each part travels in a run of its own; unpack.sh keeps the parts in DIR/parts and, once it
# has them all, unpacks the staged release into DIR (default /tmp/staged/flashinfer-0.7.4), where
# bench/peers_gpu.sh finds it (runs following one another, before the host clears /tmp):
#   run 1, with .flashinfer-0.7.4/1 in the tree:  bash .flashinfer-0.7.4/1/unpack.sh     (and so on)
#   then, with .peers and .whl:                   bash bench/peers_gpu.sh
# Needs python3 with pip, unzip, tar, xz, split, numfmt and sha256sum.
set -euo pipefail
fi_ver=0.7.4 nvml_ver=13.615.71
part_mib=${PART_MIB:-54}
here=$(cd "$(dirname "$0")" && pwd)
root=$(git rev-parse --show-toplevel)
dst="$root/.flashinfer-$fi_ver"
prebuilt=${PREBUILT:-$root/../shared/gpu/peers/flashinfer-$fi_ver-topk-sm90a.so.xz}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
out="$tmp/out"   # written by parts.sh cut, moved to .flashinfer-VERSION/ once complete
mkdir -p "$tmp/dl" "$tmp/rel"

if [ -n "${FLASHINFER_WHEELS:-}" ]; then
  echo "== the wheels in $FLASHINFER_WHEELS"
  cp -- "$FLASHINFER_WHEELS"/flashinfer_python-$fi_ver-*.whl "$FLASHINFER_WHEELS"/nvidia_ml_py-$nvml_ver-*.whl "$tmp/dl/"
else
  echo "== downloading wheels"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform any -d "$tmp/dl" "flashinfer-python==$fi_ver" "nvidia-ml-py==$nvml_ver"
fi
# The exact files read; a version bump must update these lines.
(cd "$tmp/dl" && sha256sum -c --quiet) <<'SUMS' || { echo "stage_flashinfer: a wheel is not the expected file" >&2; exit 1; }
a051a62e09a2738e8b0de47a1944fd2f0f3eff01b728b662141ea660cb09dd32  flashinfer_python-0.7.4-py3-none-any.whl
959bf4adf6fe1308e4bd739e722236b0d1ec8392e2cefad33ff70c311380b9b6  nvidia_ml_py-13.615.71-py3-none-any.whl
SUMS

echo "== flashinfer $fi_ver, trimmed to the top-k"
whl="$tmp/dl/flashinfer_python-$fi_ver-py3-none-any.whl"
csrc="topk.cu cub_topk.cu flashinfer_topk_binding.cu flashinfer_fast_topk_clusters_binding.cu"
x="$tmp/rel"
TZ=UTC unzip -q "$whl" 'flashinfer/*' -x 'flashinfer/data/*' -d "$x"
TZ=UTC unzip -q "$whl" "flashinfer_python-$fi_ver.dist-info/*" 'flashinfer/data/include/*' 'flashinfer/data/cccl/*' \
  'flashinfer/data/spdlog/*' $(for f in $csrc topk_transform_checks.h tvm_ffi_utils.h; do echo "flashinfer/data/csrc/$f"; done) -d "$x"
got=$(grep -o 'FLASHINFER_CSRC_DIR / "[^"]*"' "$x/flashinfer/jit/topk.py" | cut -d'"' -f2 | tr '\n' ' ')
[ "$got" = "$csrc " ] || { echo "stage_flashinfer: gen_topk_module compiles '$got', expected '$csrc'" >&2; exit 1; }
grep -q 'FLASHINFER_AOT_DIR: pathlib.Path = _package_root / "data" / "aot"' "$x/flashinfer/jit/env.py" ||
  { echo "stage_flashinfer: flashinfer/jit/env.py no longer loads AOT modules from data/aot" >&2; exit 1; }
mkdir -p "$x/flashinfer/data/cutlass/include" "$x/flashinfer/data/cutlass/tools/util/include"
TZ=UTC unzip -q "$tmp/dl/nvidia_ml_py-$nvml_ver-py3-none-any.whl" pynvml.py "nvidia_ml_py-$nvml_ver.dist-info/*" -d "$x"
module="none: the first call compiles it on the host"
if [ -f "$prebuilt" ]; then
  mkdir -p "$x/flashinfer/data/aot/topk"
  xz -dc "$prebuilt" > "$x/flashinfer/data/aot/topk/topk.so"
  module="$(basename "$prebuilt"), sha256 $(sha256sum < "$x/flashinfer/data/aot/topk/topk.so" | cut -c1-64)"
fi
echo "prebuilt top-k module: $module"

echo "== one tar.xz, cut into parts of at most $part_mib MiB"
tar -C "$x" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -cf - . | xz -9 -T0 > "$tmp/flashinfer.tar.xz"
echo "release flashinfer-$fi_ver" > "$tmp/sums"   # in each part's SHA256SUMS, read by unpack.sh

cat > "$tmp/unpack.sh" <<'EOF'
#!/usr/bin/env bash
# One part of a FlashInfer release staged by staging/stage_flashinfer.sh, on the GPU host (no network).
# From the project root, one run per part, the runs following one another (before the host clears /tmp):
#   bash .flashinfer-VERSION/N/unpack.sh [DIR]     (DIR defaults to /tmp/staged/flashinfer-VERSION)
# Keeps this part in DIR/parts (parts.sh join); once every part is there, joins them (checked) and
# unpacks the staged release into DIR: flashinfer/, its dist-info, pynvml.py and its dist-info.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
rel=$(sed -n 's/^release //p' "$here/SHA256SUMS")
[ -n "$rel" ] || { echo "unpack.sh: $here/SHA256SUMS names no release" >&2; exit 1; }
T=$(mkdir -p "${1:-/tmp/staged/$rel}" && cd "${1:-/tmp/staged/$rel}" && pwd)
[ "$T" != / ] || { echo "unpack.sh: refusing to unpack into /" >&2; exit 1; }
if [ -f "$T/.unpacked" ]; then echo "$rel already unpacked in $T"; exit 0; fi
rc=0; bash "$here/parts.sh" join "$here" "$T" || rc=$?  # keeps this part; 10: others still missing
[ "$rc" != 10 ] || exit 0
[ "$rc" = 0 ] || exit "$rc"
tar -C "$T" -xJf "$T/flashinfer.tar.xz" && rm -f "$T/flashinfer.tar.xz" && touch "$T/.unpacked"
echo "$rel unpacked into $T as a staged release: $(ls "$T" | tr '\n' ' ')"
EOF
parts=$(bash "$here/parts.sh" cut "$tmp/flashinfer.tar.xz" "$out" "${part_mib}M" "$tmp/sums" "$tmp/unpack.sh")
{
  echo "FlashInfer $fi_ver staged by staging/stage_flashinfer.sh as a staged release: $parts part(s), one run each:"
  for d in $(seq 1 "$parts"); do echo "  run $d, with .flashinfer-$fi_ver/$d in the tree: bash .flashinfer-$fi_ver/$d/unpack.sh"; done
  echo "(unpacked into /tmp/staged/flashinfer-$fi_ver, where bench/peers_gpu.sh finds it)"
  echo "prebuilt top-k module: $module"
  echo "wheels (sha256):"; (cd "$tmp/dl" && sha256sum -- *.whl)
} > "$out/MANIFEST.txt"
rm -rf "$dst"; mv "$out" "$dst"
echo; (cd "$dst" && find . -type f | sort | xargs ls -l | awk '{printf "%12d  %s\n", $5, $NF}')
echo; cat "$dst/MANIFEST.txt"
