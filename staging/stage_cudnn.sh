#!/usr/bin/env bash
# Stage cuDNN frontend's DSA indexer top-k (the `cudnn-indexer-topk` adapter, logitreplay/selectors/upstream/cudnn.py)
# for an offline GPU host (no network; Python 3.12, torch 2.11 cu130, CUDA 13) that takes files in
# parts of at most about 64 MiB, one run each. Run from the project root on a machine with network:
#   bash staging/stage_cudnn.sh
# It downloads the six cp312 manylinux x86-64 wheels below (checked against their sha256; CUDNN_WHEELS=DIR
# takes them from DIR instead, checked the same way) and writes .cudnn/ (git-ignored, replaced on each
# run): one tar of the wheels cut by staging/parts.sh into parts of at most $PART_MIB MiB (default 46,
# so that a part and the tree of about 15 MiB fit the 64 MiB of one run),
# part N in .cudnn/N/ with unpack.sh, parts.sh and SHA256SUMS, and MANIFEST.txt. Each part travels in a
# run of its own; unpack.sh keeps the parts in /tmp/cudnn/parts (parts.sh join) and, once it has them
# all, installs the wheels (pip install --no-index --no-deps --target /tmp/cudnn/site) and writes
# /tmp/cudnn/env.sh. Where the host clears /tmp soon after a run, the runs must follow one
# another:
#   run 1, with .cudnn/1 in the tree:          bash .cudnn/1/unpack.sh
#   run 2, with .cudnn/2 in the tree:          bash .cudnn/2/unpack.sh
#   run 3, with .cudnn/3 and .peers:           bash .cudnn/3/unpack.sh; bash bench/peers_gpu.sh
#                                              (peers_gpu.sh reads /tmp/cudnn/env.sh)
#
# Sizes measured (2026-12-03), bytes:
#   nvidia_cudnn_frontend-1.32.0-cp312        11,619,860  (the frontend; 4.5 MB pybind module, Python kernels)
#   nvidia_cutlass_dsl-4.8.1                      10,510  (meta package: its .pth puts dsl_packages on sys.path)
#   nvidia_cutlass_dsl_libs_base-4.8.1-cp312   3,050,567
#   nvidia_cutlass_dsl_libs_core-4.8.1         1,635,096  (CuTe DSL Python sources)
#   nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312  91,954,433  (MLIR compiler 193 MB and runtime 44 MB unpacked,
#                                                          already stripped; xz -9e gets them to 63.5 MB only)
#   apache_tvm_ffi-0.1.11-cp312-abi3           2,697,683  (the file .peers stages: one tvm-ffi for every peer)
#   in all                                   110,968,149  (105.8 MiB: parts of 46, 46 and 13.8 MiB); about
#                                                          330 MB installed
# Not staged: nvidia-cutlass-dsl-libs-cu12 4.8.1 (91,697,915; nvidia-cutlass-dsl's default flavour, which
# its loader passes over when the driver supports CUDA 13, as torch cu130's does), and what the GPU image
# already has: cuda-bindings (cuda-python 13.4.4 is a 7,594-byte meta package over cuda-bindings 13.4.4,
# 7,172,184, cuda-core 1.2.2, 6,610,599, and cuda-pathfinder 1.9.1, 63,462; the top-k path imports only
# cuda.bindings.driver), protobuf (7.36.2: 343,223), typing-extensions and numpy. unpack.sh checks them.
# The declared needs: nvidia-cudnn-frontend needs nvidia-cutlass-dsl[cu13]>=4.8.0 and apache-tvm-ffi>=0.1.11
# (its extra `cutedsl` adds cuda-python); the cutlass-dsl libs need cuda-bindings>=12.8, protobuf>=4.21.12
# and typing-extensions>=4.10.
# Needs python3 with pip, tar, split, numfmt and sha256sum.
set -eu
cudnn_ver=1.32.0 dsl_ver=4.8.1 tvm_ver=0.1.11
part_mib=${PART_MIB:-46}
root=$(git rev-parse --show-toplevel)
dst="$root/.cudnn"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
out="$tmp/out"   # written by parts.sh cut, moved to .cudnn/ once complete
mkdir -p "$tmp/dl"

if [ -n "${CUDNN_WHEELS:-}" ]; then
  echo "== the wheels in $CUDNN_WHEELS"
  (cd "$CUDNN_WHEELS" && cp -- *.whl "$tmp/dl/")
else
echo "== downloading wheels"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform any -d "$tmp/dl" "nvidia-cudnn-frontend==$cudnn_ver" "nvidia-cutlass-dsl==$dsl_ver" \
  "nvidia-cutlass-dsl-libs-base==$dsl_ver" "nvidia-cutlass-dsl-libs-core==$dsl_ver" \
  "nvidia-cutlass-dsl-libs-cu13==$dsl_ver" "apache-tvm-ffi==$tvm_ver"
fi
# The exact files measured above; a version bump must update these lines (and the sizes).
cat > "$tmp/WHEELS.sha256" <<'SUMS'
8b354a8e550c083eb247f1eb39a7d69a4a269075f5a01e4fcbd2531680b17239  nvidia_cudnn_frontend-1.32.0-cp312-cp312-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl
43ed46b21d151aa643c6765457c7310827b938c1cf45d5109a0152de4ef06227  nvidia_cutlass_dsl-4.8.1-py3-none-any.whl
ac2fd8c7fa3d6ded00917fa7cba8686061005da8c4703c6a29e03c1504543909  nvidia_cutlass_dsl_libs_base-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl
bacc6760e3286db447d45720d32ae58ac2e6cecade1152345ef784b2d5e44431  nvidia_cutlass_dsl_libs_core-4.8.1-py3-none-any.whl
50191a381d8cc1393373ae0bc879b0aefa9a256c23c22d4fa1c2fe3dfe57bc90  nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl
2843f084cdc94dedacd8b257a395a2b71b8a3dc7fc99711b148bf1d161983128  apache_tvm_ffi-0.1.11-cp312-abi3-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl
SUMS
(cd "$tmp/dl" && sha256sum -c --quiet "$tmp/WHEELS.sha256") ||
  { echo "stage_cudnn: a downloaded wheel is not the expected file (see above)" >&2; exit 1; }
[ "$(ls "$tmp/dl" | wc -l)" = 6 ] || { echo "stage_cudnn: expected exactly the six wheels, got: $(ls "$tmp/dl")" >&2; exit 1; }

echo "== one tar, cut into parts of at most $part_mib MiB"
# A tar whose bytes depend only on the wheels (names sorted, owner and times fixed), so the parts' sums
# are the same on every run.
tar -C "$tmp/dl" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -cf "$tmp/wheels.tar" .
sed 's/^/wheel /' "$tmp/WHEELS.sha256" > "$tmp/wheel-sums"  # in each part's SHA256SUMS, read by unpack.sh

cat > "$tmp/unpack.sh" <<'EOF'
#!/usr/bin/env bash
# One part of cuDNN frontend's indexer top-k, staged by staging/stage_cudnn.sh, on the GPU host (no
# network; python3 with pip and torch). From the project root, one run per part, the runs following
# one another (before the host clears /tmp):
#   bash .cudnn/N/unpack.sh [DIR]      (DIR defaults to /tmp/cudnn)
# Keeps this part in DIR/parts (unpack_part of parts.sh, beside this script); once every part is there,
# joins them into DIR/wheels.tar (checked), checks the wheels, installs them into DIR/site (pip install
# --no-index --no-deps --target) and writes DIR/env.sh, the exports a command runs before importing
# cudnn: . DIR/env.sh. CUDNN_PYTHON picks the python.
set -eu
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
unpacked() { [ -f "$T/env.sh" ] && [ -d "$T/site/cudnn" ] && echo "cudnn already unpacked in $T: . $T/env.sh"; }
. "$here/parts.sh"
# sets T; exits 0 where unpacked already or while parts are missing
unpack_part "$here" /tmp/cudnn unpacked "${1:-}"
PY=${CUDNN_PYTHON:-python3}
rm -rf "$T/wheels" "$T/site"; mkdir -p "$T/wheels" "$T/ws"
tar -C "$T/wheels" -xf "$T/wheels.tar"
sed -n 's/^wheel //p' "$here/SHA256SUMS" | (cd "$T/wheels" && sha256sum -c --quiet) ||
  { echo "unpack.sh: a wheel does not match its sum" >&2; exit 1; }
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$T/site" "$T/wheels"/*.whl
rm -rf "$T/wheels"
# nvidia_cutlass_dsl_packages.pth would put dsl_packages on sys.path in a site directory; --target is none.
{
  echo "export PYTHONPATH=$T/site:$T/site/nvidia_cutlass_dsl/dsl_packages\${PYTHONPATH:+:\$PYTHONPATH}"
  echo "export CUTE_DSL_CACHE_DIR=$T/ws/cute_dsl TVM_FFI_CACHE_DIR=$T/ws/tvm_ffi"
} > "$T/env.sh.new"
. "$T/env.sh.new"
"$PY" - <<'PYEOF' || { echo "unpack.sh: the GPU image lacks what the wheels need (above)" >&2; exit 1; }
import importlib
for module in ("cuda.bindings.driver", "google.protobuf", "typing_extensions", "torch"):
    importlib.import_module(module)  # not staged: the GPU image has them
import cudnn, cutlass, tvm_ffi
print(f"cudnn {cudnn.__version__}, cutlass-dsl {cutlass.__version__}, tvm_ffi {tvm_ffi.__version__}")
PYEOF
mv "$T/env.sh.new" "$T/env.sh"  # only a checked install counts as unpacked
rm -f "$T/wheels.tar"
echo "cudnn unpacked into $T ($(du -sh "$T/site" | cut -f1)); before importing cudnn run: . $T/env.sh"
cat "$T/env.sh"
EOF
parts=$(bash "$root/staging/parts.sh" cut "$tmp/wheels.tar" "$out" "${part_mib}M" "$tmp/wheel-sums" "$tmp/unpack.sh")

{
  echo "cuDNN frontend's DSA indexer top-k, staged by staging/stage_cudnn.sh: $parts parts, one run each, in order:"
  for d in $(seq 1 "$parts"); do echo "  run $d, with .cudnn/$d$([ "$d" = "$parts" ] && echo ' and .whl') in the tree: bash .cudnn/$d/unpack.sh"; done
  echo "nvidia-cudnn-frontend $cudnn_ver, nvidia-cutlass-dsl $dsl_ver (libs base, core, cu13), apache-tvm-ffi $tvm_ver"
  echo "Wheels (bytes, sha256):"
  (cd "$tmp/dl" && for w in *.whl; do echo "  $(stat -c %s "$w")  $(sha256sum "$w" | cut -c1-64)  $w"; done)
} > "$out/MANIFEST.txt"

rm -rf "$dst"; mv "$out" "$dst"

echo; (cd "$dst" && find . -type f | sort | xargs ls -l | awk '{printf "%12d  %s\n", $5, $NF}')
big=$(find "$dst" -type f -size +"${part_mib}"M)
[ -z "$big" ] || { echo "stage_cudnn: a part is over $part_mib MiB: $big" >&2; exit 1; }
echo; cat "$dst/MANIFEST.txt"
cat <<MSG

Each run takes one part (with the working tree: keep each under 64 MiB). After the last,
  . /tmp/cudnn/env.sh
makes \`import cudnn\` and \`cutlass\` work, and the adapter \`cudnn-indexer-topk\` compiles its kernel
for the GPU in prepare (CuTe DSL, about a second a shape on 2 CPU cores).
MSG
