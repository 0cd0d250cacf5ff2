#!/usr/bin/env bash
# Stage one sglang-kernel release's sm90 library (the `sgl-fast-topk*` adapters) as a staged release for an
# offline GPU host (torch 2.11 cu130, CUDA 13). Run from the project root on a machine with network:
#   bash staging/stage_sgl_kernel.sh [VERSION]     (default 0.4.6, the newest built for torch 2.11)
# It downloads the cp310-abi3 manylinux2014 x86-64 wheel (about 377 MB; checked against its sha256 below;
# SGL_KERNEL_WHEELS=DIR takes it from DIR instead, checked the same way) and keeps only what the top-k
# ops need: sgl_kernel/sm90/common_ops.abi3.so (16.1 MB in 0.4.6, 12.3 MB in 0.4.10; it registers
# torch.ops.sgl_kernel.fast_topk, fast_topk_transform_fused and fast_topk_transform_ragged_fused), laid
# out as sgl_kernel/common_ops.abi3.so with a STAND-IN sgl_kernel/__init__.py written here (the real one
# imports every op group and a 1.1 GB attention library) that loads it, and the wheel's dist-info (its
# version, and the torch it requires: a release built for another torch says so when it fails to load).
# 0.4.6.post1 and later are built for torch 2.13.0 or 2.14.1 and do not load into torch 2.11 (staging/
# README.md says why); staging one shows that in its columns. The result, one tar.xz cut by
# staging/parts.sh into parts of at most $PART_MIB MiB (default 46; 0.4.10 makes one of 7.3 MiB), goes to
# .sglang-kernel-VERSION/N/ (git-ignored, replaced on each run) with unpack.sh, parts.sh, SHA256SUMS and
# MANIFEST.txt; unpack.sh lays the release out in DIR (default /tmp/staged/sglang-kernel-VERSION), where
# bench/peers_gpu.sh finds it:
#   with .sglang-kernel-0.4.6/1 in the tree: bash .sglang-kernel-0.4.6/1/unpack.sh
# Needs python3 with pip, unzip, tar, xz, split, numfmt and sha256sum.
set -euo pipefail
ver=${1:-0.4.6}
case $ver in  # the wheels read; another release needs its line here
  0.4.6) sum=30127466b4a8058043c71f0f848ebbf33c9f2e20ebb8fc09a0abf8a0104e32d4 ;;
  0.4.10) sum=043cbe4a10e7887ea1b25599b729ff1ce115a0d5217b2c177aff9f9ae5327724 ;;
  *) echo "stage_sgl_kernel: no sha256 for sglang-kernel $ver here (0.4.6, 0.4.10)" >&2; exit 1 ;;
esac
whl_name=sglang_kernel-$ver-cp310-abi3-manylinux2014_x86_64.whl
part_mib=${PART_MIB:-46}
here=$(cd "$(dirname "$0")" && pwd)
root=$(git rev-parse --show-toplevel)
dst="$root/.sglang-kernel-$ver"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
out="$tmp/out"   # written by parts.sh cut, moved to .sglang-kernel-VERSION/ once complete
mkdir -p "$tmp/dl" "$tmp/rel/sgl_kernel"

if [ -n "${SGL_KERNEL_WHEELS:-}" ]; then
  cp -- "$SGL_KERNEL_WHEELS/$whl_name" "$tmp/dl/"
else
  echo "== downloading $whl_name"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 -d "$tmp/dl" "sglang-kernel==$ver"
fi
echo "$sum  $whl_name" | (cd "$tmp/dl" && sha256sum -c --quiet) ||
  { echo "stage_sgl_kernel: $whl_name is not the expected file" >&2; exit 1; }

x="$tmp/rel"
unzip -q -p "$tmp/dl/$whl_name" sgl_kernel/sm90/common_ops.abi3.so > "$x/sgl_kernel/common_ops.abi3.so"
chmod 755 "$x/sgl_kernel/common_ops.abi3.so"
TZ=UTC unzip -q "$tmp/dl/$whl_name" "sglang_kernel-$ver.dist-info/*" -d "$x"
for op in fast_topk fast_topk_transform_fused fast_topk_transform_ragged_fused; do
  grep -aq "$op(Tensor score" "$x/sgl_kernel/common_ops.abi3.so" ||
    { echo "stage_sgl_kernel: $ver's sm90 library registers no $op" >&2; exit 1; }
done
cat > "$x/sgl_kernel/__init__.py" <<EOF
# STAND-IN written by staging/stage_sgl_kernel.sh: not sglang-kernel's package, whose __init__ imports
# every op group. It only loads sglang-kernel $ver's sm90 common_ops.abi3.so beside it, which registers
# torch.ops.sgl_kernel.fast_topk, fast_topk_transform_fused and fast_topk_transform_ragged_fused.
import os

import torch

__version__ = "$ver"
torch.ops.load_library(os.path.join(os.path.dirname(os.path.abspath(__file__)), "common_ops.abi3.so"))
EOF
tar -C "$x" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -cf - . | xz -9 -T0 > "$tmp/sgl_kernel.tar.xz"
echo "release sglang-kernel-$ver" > "$tmp/sums"   # in each part's SHA256SUMS, read by unpack.sh

cat > "$tmp/unpack.sh" <<'EOF'
#!/usr/bin/env bash
# One part of an sglang-kernel release staged by staging/stage_sgl_kernel.sh, on the GPU host (no
# network). From the project root, one run per part:
#   bash .sglang-kernel-VERSION/N/unpack.sh [DIR]     (DIR defaults to /tmp/staged/sglang-kernel-VERSION)
# Keeps this part in DIR/parts (unpack_part of parts.sh, beside this script); once every part is there,
# joins them (checked) and unpacks the staged release into DIR: sgl_kernel/ (the library and its loader)
# and the release's dist-info.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
unpacked() { [ -f "$T/.unpacked" ] && echo "$rel already unpacked in $T"; }
. "$here/parts.sh"
# sets rel and T; exits 0 where unpacked already or while parts are missing
unpack_part "$here" "/tmp/staged/{release}" unpacked "${1:-}"
tar -C "$T" -xJf "$T/sgl_kernel.tar.xz" && rm -f "$T/sgl_kernel.tar.xz" && touch "$T/.unpacked"
echo "$rel unpacked into $T as a staged release: $(ls "$T" | tr '\n' ' ')"
EOF
parts=$(bash "$here/parts.sh" cut "$tmp/sgl_kernel.tar.xz" "$out" "${part_mib}M" "$tmp/sums" "$tmp/unpack.sh")
{
  echo "sglang-kernel $ver's sm90 library, staged by staging/stage_sgl_kernel.sh as a staged release: $parts part(s):"
  for d in $(seq 1 "$parts"); do echo "  run $d, with .sglang-kernel-$ver/$d in the tree: bash .sglang-kernel-$ver/$d/unpack.sh"; done
  echo "(unpacked into /tmp/staged/sglang-kernel-$ver, where bench/peers_gpu.sh finds it)"
  echo "wheel (sha256): $sum  $whl_name"
  echo "library (sha256): $(sha256sum < "$x/sgl_kernel/common_ops.abi3.so" | cut -c1-64)  sgl_kernel/common_ops.abi3.so"
} > "$out/MANIFEST.txt"
rm -rf "$dst"; mv "$out" "$dst"
echo; (cd "$dst" && find . -type f | sort | xargs ls -l | awk '{printf "%12d  %s\n", $5, $NF}')
echo; cat "$dst/MANIFEST.txt"
