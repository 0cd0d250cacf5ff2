#!/usr/bin/env bash
# Stage one release of FlashInfer's DSA top-k (the flashinfer* adapters: logitreplay/selectors/upstream/
# flashinfer.py, flashinfer074.py, `-det` included) for the offline GPU host (an H200, sm_90a; Python 3.12,
# torch 2.11 cu130, CUDA 13.0 nvcc; the tvm-ffi that .peers installs) as a staged release beside the
# 0.7.2.post1 that .peers installs there. Run from the project root on a machine with network (no GPU):
#   bash staging/stage_flashinfer.sh [VERSION]     (default 0.7.4; staging/flashinfer.sha256 lists those known)
#
# FlashInfer compiles its top-k module (`flashinfer.jit.topk.gen_topk_module()`: four CUDA sources, radix,
# CUB and SM100-clusters top-k with their ragged and page-table transforms) on first use, which takes
# longer than a GPU run may (one nvcc of cub_topk.cu alone is 25+ minutes on one core), so the module
# goes to the host prebuilt for sm_90a, where FlashInfer's AOT loader looks before any JIT build
# (flashinfer/jit/env.py: the package's data/aot/NAME/NAME.so). `top_k_varlen` (flashinfer/topk_varlen/)
# is a separate API of CuTe DSL kernels for SM100 and newer; the adapters' calls (top_k,
# top_k_ragged_transform, top_k_page_table_transform) never reach it, so nothing of it is built.
#
# The cache folder CACHE ($STAGING_CACHE/flashinfer-VERSION, STAGING_CACHE defaulting to
# ~/.cache/logitreplay-staging; outside the tree, kept between runs) holds:
#   wheels/      the wheels of staging/flashinfer.sha256 (flashinfer-python 0.7.4: 101,294,319 bytes;
#                downloaded when missing; FLASHINFER_WHEELS=DIR takes them from DIR instead), each checked
#                against its sum
#   flashinfer-VERSION-topk-sm90a.so.xz   the prebuilt module (stripped); with SHA256SUMS, BUILD.txt
#                (what it was built with, its flags and wall time), build.log and build/ (the build's tree)
# PREBUILT=FILE.so.xz stages another prebuilt module instead. When the .so.xz is missing, the module is
# built first, by FlashInfer's own JIT build (`build()` of the
# spec above, so the sources and flags are upstream's), under `nice -n 10`: allow 30-60+ minutes on a
# shared 2-core machine; run the script in the background (its output says where build.log is). The
# build needs PYTHON (default python3) importing torch (a CPU build is enough: FlashInfer reads its C++
# ABI flag; the module itself does not link torch), nvcc 13 in CUDA_HOME (default /usr/local/cuda),
# ninja, c++, strip and nm. What the toolkit lacks comes from the package registry, installed with
# `pip install --no-deps --target CACHE/build/site` (never another torch): apache-tvm-ffi (headers and
# library), nvidia-curand's headers (topk.cu includes curand), nvidia-cuda-cuobjdump (to check the code's
# architecture), and the pure-Python wheels `import flashinfer` needs that PYTHON lacks. The module links
# -lcuda: where CUDA_HOME has no libcuda.so, an empty library named libcuda.so.1 stands in (the module
# calls no driver function; the host's driver is loaded by torch). MAX_JOBS (default 2) parallel nvcc.
#
# Then it writes DEST (default .flashinfer-VERSION; git-ignored, replaced on each run): one tar.xz of the
# staged release and the fallback wheels, cut by staging/parts.sh into parts of at most $PART_MIB MiB
# (default 46; 0.7.4 makes one of 23.5 MiB), part N in DEST/N/ with unpack.sh, parts.sh and
# SHA256SUMS, and MANIFEST.txt. The staged release, as the host
# gets it in /tmp/staged/flashinfer-VERSION: flashinfer/ from the wheel (every file outside data/ but
# C/C++/CUDA sources, which belong to other JIT modules; data/include, data/cccl, data/spdlog; of
# data/csrc the module's sources and the headers they include; data/cutlass as empty include dirs), the
# module as flashinfer/data/aot/topk/topk.so, and flashinfer_python-VERSION.dist-info/METADATA. On the
# host, each part is unpacked in a run of its own (staging/README.md's order of runs), or by
# bench/peers_gpu.sh where it travels with .peers; bench/peers.py then gives each FlashInfer adapter that
# takes the release a column `NAME@flashinfer-VERSION` beside the installed 0.7.2.post1's:
#   bash .flashinfer-0.7.4/1/unpack.sh [DIR]
# Needs python3 with pip, unzip, tar, xz, split, numfmt, sha256sum, and nm (cuobjdump where found).
set -euo pipefail
die() { echo "stage_flashinfer: $1" >&2; exit "${2:-1}"; }  # die MESSAGE [STATUS]
[ "$#" -le 1 ] || die "usage: bash staging/stage_flashinfer.sh [VERSION]" 2
ver=${1:-0.7.4}
root=$(git rev-parse --show-toplevel)
table="$root/staging/flashinfer.sha256"
known=$(sed -n 's/^[0-9a-f]\{64\}  flashinfer_python-\(.*\)-py3-none-any\.whl$/\1/p' "$table" | xargs)
whl_name="flashinfer_python-$ver-py3-none-any.whl"
grep -q "^[0-9a-f]\{64\}  $(printf '%s' "$whl_name" | sed 's/[.]/[.]/g')\$" "$table" ||
  die "FlashInfer $ver is not a release this script knows (staging/flashinfer.sha256 lists: ${known:-none})" 2
tvm_ver=0.1.11 curand_ver=10.4.5.25 cuobjdump_ver=13.2.51   # the build's helpers (tvm-ffi: .peers' own)
# The pure-Python wheels `import flashinfer` needs, as MODULE:WHEEL-PREFIX; installed only where missing.
deps="pynvml:nvidia_ml_py requests:requests urllib3:urllib3 idna:idna charset_normalizer:charset_normalizer certifi:certifi packaging:packaging"
part_mib=${PART_MIB:-46}
dest_name=${DEST:-.flashinfer-$ver}
dst="$root/$dest_name"
cache=${STAGING_CACHE:-$HOME/.cache/logitreplay-staging}/flashinfer-$ver
prebuilt=${PREBUILT:-$cache/flashinfer-$ver-topk-sm90a.so.xz}
wheels=${FLASHINFER_WHEELS:-$cache/wheels}
mkdir -p "$cache"
git -C "$root" check-ignore -q "$dest_name/x" || echo "/$dest_name/" >> "$(git -C "$root" rev-parse --git-path info/exclude)"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# ---------------------------------------------------------------------------------------------- wheels
wheel_of() { sed -n "s/^[0-9a-f]\{64\}  \($1-[^-]*-py3-none-any\.whl\)\$/\1/p" "$table" | head -1; }
need="$whl_name"
for d in $deps; do need="$need $(wheel_of "${d#*:}")"; done
mkdir -p "$wheels"
for w in $need; do
  [ -f "$wheels/$w" ] || [ -n "${FLASHINFER_WHEELS:-}" ] || {
    spec=$(printf '%s' "$w" | sed 's/^\([^-]*\)-\([^-]*\)-.*/\1==\2/')
    echo "== downloading $spec"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform any -d "$wheels" "$spec"
  }
  grep "  $w\$" "$table" | (cd "$wheels" && sha256sum -c --quiet --strict) ||
    die "$wheels/$w is missing or not the expected file (staging/flashinfer.sha256)"
done
whl="$wheels/$whl_name"

# ------------------------------------------------------------------------------ the package, trimmed
# trim DIR: flashinfer/ from the wheel as the top-k needs it, into DIR; prints the module's sources.
trim() {
  local x=$1 csrc f inc
  TZ=UTC unzip -q "$whl" 'flashinfer/*' -x 'flashinfer/data/*' -d "$x"
  find "$x/flashinfer" -type f \( -name '*.cu' -o -name '*.cuh' -o -name '*.h' -o -name '*.hpp' -o -name '*.c' \
    -o -name '*.cc' -o -name '*.cpp' \) -delete
  csrc=$(grep -o 'FLASHINFER_CSRC_DIR / "[^"]*"' "$x/flashinfer/jit/topk.py" | cut -d'"' -f2 | xargs)
  [ -n "$csrc" ] || die "flashinfer/jit/topk.py names no source of the top-k module"
  grep -q '_package_root / "data" / "aot"' "$x/flashinfer/jit/env.py" &&
    grep -q 'FLASHINFER_AOT_DIR / module_name / f"{module_name}.so"' "$x/flashinfer/jit/env.py" ||
    die "flashinfer/jit/env.py no longer loads AOT modules from data/aot/NAME/NAME.so"
  TZ=UTC unzip -q "$whl" 'flashinfer/data/include/*' 'flashinfer/data/cccl/*' 'flashinfer/data/spdlog/*' \
    $(for f in $csrc; do echo "flashinfer/data/csrc/$f"; done) -d "$x"
  # the headers of data/csrc that those sources include by a quoted name
  inc=$(cd "$x/flashinfer/data/csrc" && cat $csrc | sed -n 's/^#include "\([^"]*\)".*/\1/p' | sort -u)
  for f in $inc; do
    unzip -l "$whl" "flashinfer/data/csrc/$f" > /dev/null 2>&1 && TZ=UTC unzip -q "$whl" "flashinfer/data/csrc/$f" -d "$x"
  done
  mkdir -p "$x/flashinfer/data/cutlass/include" "$x/flashinfer/data/cutlass/tools/util/include"
  echo "$csrc"
}

# exports DIR: the module's entry points as flashinfer/topk.py looks them up (`module.NAME` on what
# tvm-ffi loaded), one a line
exports() {
  grep -oE '\bmodule\.[a-z_0-9]+' "$1/flashinfer/topk.py" | cut -d. -f2 | sort -u
}

# check_module SO TREE: the tvm-ffi entry points the Python side looks up, and sm_90a code
check_module() {
  local so=$1 n missing=""
  for n in $(exports "$2"); do
    nm -D --defined-only "$so" | grep -q " T __tvm_ffi_$n\$" || missing="$missing $n"
  done
  [ -z "$missing" ] || die "$so exports no tvm-ffi entry point for:$missing"
  local cuobjdump
  cuobjdump=$(command -v cuobjdump || ls "$cache/build/site/nvidia/cu13/bin/cuobjdump" 2>/dev/null || true)
  if [ -n "$cuobjdump" ]; then
    "$cuobjdump" --list-elf "$so" > "$so.elfs"
    grep -q '\.sm_90a\.cubin$' "$so.elfs" || die "$so holds no sm_90a code ($cuobjdump --list-elf)"
    echo "sm_90a ($(wc -l < "$so.elfs") cubins)"
    rm -f "$so.elfs"
  else
    echo "unchecked (no cuobjdump)"
  fi
}

# missing_deps DIR PY: the fallback wheels (in DIR) of the modules PY cannot import
missing_deps() {
  local d
  for d in $deps; do "$2" -c "import ${d%%:*}" 2> /dev/null || echo "$1/$(wheel_of "${d#*:}")"; done
}

# ------------------------------------------------------------------------------------------- build
build_module() {
  local b="$cache/build" py=${PYTHON:-python3} cuda=${CUDA_HOME:-/usr/local/cuda} stub="" inc="" so start wall
  [ -x "$cuda/bin/nvcc" ] || die "no nvcc in $cuda/bin (set CUDA_HOME)"
  for t in ninja c++ strip nm; do command -v "$t" > /dev/null || die "the build needs $t"; done
  "$py" -c "import torch" 2> /dev/null ||
    die "PYTHON ($py) cannot import torch: FlashInfer's JIT build needs it (a CPU build is enough)"
  echo "== building FlashInfer $ver's top-k module for sm_90a (log: $cache/build.log)"
  rm -rf "$b"; mkdir -p "$b/dl" "$b/site" "$b/src" "$b/ws"
  "$py" -m pip download -q --no-deps --only-binary=:all: -d "$b/dl" "apache-tvm-ffi==$tvm_ver" \
    "nvidia-curand==$curand_ver" "nvidia-cuda-cuobjdump==$cuobjdump_ver"
  "$py" -m pip install -q --no-index --no-deps --no-compile --target "$b/site" "$b/dl"/*.whl $(missing_deps "$wheels" "$py")
  trim "$b/src" > /dev/null
  [ -f "$cuda/include/curand.h" ] || inc="-isystem $b/site/nvidia/cu13/include"
  if [ ! -e "$cuda/lib64/libcuda.so" ] && [ ! -e "$cuda/lib64/stubs/libcuda.so" ]; then
    mkdir -p "$b/culink" && : > "$b/culink/empty.c"
    c++ -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$b/culink/libcuda.so" -x c "$b/culink/empty.c"
    stub="-L$b/culink"
  fi
  start=$(date +%s)
  env PYTHONPATH="$b/site:$b/src" CUDA_HOME="$cuda" FLASHINFER_WORKSPACE_BASE="$b/ws" FLASHINFER_CUDA_ARCH_LIST=9.0a \
    FLASHINFER_EXTRA_CUDAFLAGS="$inc" FLASHINFER_EXTRA_LDFLAGS="$stub" MAX_JOBS="${MAX_JOBS:-2}" \
    nice -n 10 "$py" -c 'from flashinfer.jit.topk import gen_topk_module as g
s = g(); s.build(verbose=True); print(f"module: {s.jit_library_path}")' > "$cache/build.log" 2>&1 ||
    die "FlashInfer's build failed: $cache/build.log"
  wall=$(( $(date +%s) - start ))
  so=$(sed -n 's/^module: //p' "$cache/build.log")
  check_module "$so" "$b/src" > /dev/null
  {
    echo "as-built $(sha256sum < "$so" | cut -c1-64)  topk.so ($(stat -c %s "$so") B, as built)"
    cp "$so" "$tmp/topk.so" && strip --strip-unneeded "$tmp/topk.so"
    echo "stripped $(sha256sum < "$tmp/topk.so" | cut -c1-64)  topk.so ($(stat -c %s "$tmp/topk.so") B)"
    xz -9 -c "$tmp/topk.so" > "$prebuilt.new"
    echo "xz $(sha256sum < "$prebuilt.new" | cut -c1-64)  $(basename "$prebuilt") ($(stat -c %s "$prebuilt.new") B)"
  } > "$cache/SHA256SUMS"
  {
    echo "FlashInfer $ver top-k module (gen_topk_module) built by staging/stage_flashinfer.sh on $(date -u +%F),"
    echo "FLASHINFER_CUDA_ARCH_LIST=9.0a, MAX_JOBS=${MAX_JOBS:-2}, under nice -n 10: $wall s of wall time on $(nproc) cores."
    echo "$("$cuda/bin/nvcc" --version | tail -2 | head -1); $(c++ --version | head -1); torch $("$py" -c 'import torch; print(torch.__version__)')"
    echo "apache-tvm-ffi $tvm_ver, nvidia-curand $curand_ver (headers)${stub:+, libcuda.so: an empty stand-in named libcuda.so.1}"
    echo "nvcc flags (FlashInfer's build.ninja):"
    sed -n '/^cuda_cflags = /,/^cuda_post_cflags/p' "$(dirname "$so")/build.ninja" | sed '$d'
    cat "$cache/SHA256SUMS"
  } > "$cache/BUILD.txt"
  mv "$prebuilt.new" "$prebuilt"
  echo "built in $wall s: $prebuilt"
}

if [ ! -f "$prebuilt" ]; then
  [ -z "${PREBUILT:-}" ] || die "no prebuilt module $PREBUILT"
  build_module
fi

# ------------------------------------------------------------------------------------------- stage
echo "== FlashInfer $ver, trimmed, with its prebuilt top-k module"
rel="$tmp/payload"   # as the release folder holds it on the host: flashinfer/, and deps/ until unpacked
mkdir -p "$rel/deps"
csrc=$(trim "$rel")
mkdir -p "$rel/flashinfer/data/aot/topk"
xz -dc "$prebuilt" > "$rel/flashinfer/data/aot/topk/topk.so"
chmod 755 "$rel/flashinfer/data/aot/topk/topk.so"
arch=$(check_module "$rel/flashinfer/data/aot/topk/topk.so" "$rel")
mod_sum=$(sha256sum < "$rel/flashinfer/data/aot/topk/topk.so" | cut -c1-64)
for d in $deps; do cp "$wheels/$(wheel_of "${d#*:}")" "$rel/deps/"; done
name="flashinfer-$ver.tar.xz"
tar -C "$rel" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -cf - flashinfer deps |
  xz -9 -T0 > "$tmp/$name"
{
  echo "release $ver"
  echo "module $mod_sum  flashinfer/data/aot/topk/topk.so"
  for d in $deps; do w=$(wheel_of "${d#*:}"); echo "dep ${d%%:*} $w"; grep "  $w\$" "$table" | sed 's/^/wheel /'; done
} > "$tmp/extra-sums"

cat > "$tmp/unpack.sh" <<'EOF'
#!/usr/bin/env bash
# One part of a FlashInfer release staged by staging/stage_flashinfer.sh, on the GPU host (no network;
# python3 with pip and torch). From the project root, one run per part, the runs following one another
# (before the host clears /tmp):
#   bash .flashinfer-VERSION/N/unpack.sh [DIR]   (DIR defaults to $STAGED/flashinfer-VERSION, STAGED to /tmp/staged)
# Keeps this part in DIR/parts (unpack_part of parts.sh, beside this script); once every part is there,
# unpacks DIR/flashinfer (its top-k module prebuilt as flashinfer/data/aot/topk/topk.so, checked against
# its sum), installs into DIR those of the fallback wheels whose module this python cannot import, checks that
# `import flashinfer` from DIR gives the release where tvm-ffi imports (after .peers is unpacked; else the
# adapters' first import is the check), and only then writes DIR/flashinfer_python-VERSION.dist-info
# (which makes DIR a staged release for bench/peers.py). FLASHINFER_PYTHON picks the python.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
sums="$here/SHA256SUMS"
mod=$(sed -n 's/^module \([0-9a-f]\{64\}\)  .*/\1/p' "$sums")
unpacked() {  # the dist-info, written last, and the module as summed; names both for the steps below
  so="$T/flashinfer/data/aot/topk/topk.so" info="$T/flashinfer_python-$rel.dist-info"
  [ -f "$info/METADATA" ] && [ "$(sha256sum < "$so" 2> /dev/null | cut -c1-64)" = "$mod" ] &&
    echo "FlashInfer $rel already unpacked in $T"
}
. "$here/parts.sh"
# sets rel and T; exits 0 where unpacked already or while parts are missing
unpack_part "$here" "${STAGED:-/tmp/staged}/flashinfer-{release}" unpacked "${1:-}"
PY=${FLASHINFER_PYTHON:-python3}
name=$(sed -n 's/^whole [0-9a-f]\{64\}  //p' "$sums")
rm -rf "$info" "$T/flashinfer" "$T/deps"
tar -C "$T" -xJf "$T/$name"
[ "$(sha256sum < "$so" | cut -c1-64)" = "$mod" ] || { echo "unpack.sh: $so does not match its sum" >&2; exit 1; }
sed -n 's/^wheel //p' "$sums" | (cd "$T/deps" && sha256sum -c --quiet --strict) ||
  { echo "unpack.sh: a fallback wheel does not match its sum" >&2; exit 1; }
missing=$(sed -n 's/^dep //p' "$sums" | while read -r module wheel; do
  "$PY" -c "import $module" 2> /dev/null || echo "$T/deps/$wheel"; done)
if [ -n "$missing" ]; then
  # shellcheck disable=SC2086
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$T" $missing
fi
checked="import not checked here (no tvm_ffi: .peers brings it)"
if "$PY" -c "import tvm_ffi" 2> /dev/null; then
  "$PY" - "$T" "$rel" <<'PYEOF' || { echo "unpack.sh: FlashInfer $rel does not import from $T (above)" >&2; exit 1; }
import sys

sys.path.insert(0, sys.argv[1])
import flashinfer

assert flashinfer.__file__.startswith(sys.argv[1] + "/"), f"imported {flashinfer.__file__}, not the staged release"
assert flashinfer.__version__ == sys.argv[2], f"the staged package says {flashinfer.__version__}, not {sys.argv[2]}"
PYEOF
  checked="import checked"
fi
mkdir -p "$info"
printf 'Metadata-Version: 2.1\nName: flashinfer-python\nVersion: %s\n' "$rel" > "$info/METADATA"
rm -rf "$T/deps" "${T:?}/$name"
echo "FlashInfer $rel unpacked into $T as a staged release (top-k module prebuilt, sha256 checked;" \
  "fallback wheels installed: $(echo $missing | wc -w); $checked)"
EOF
rm -rf "$tmp/cut"
parts=$(bash "$root/staging/parts.sh" cut "$tmp/$name" "$tmp/cut" "${part_mib}M" "$tmp/extra-sums" "$tmp/unpack.sh")

{
  echo "FlashInfer $ver's DSA top-k, staged by staging/stage_flashinfer.sh: $parts part(s), one run each, in order:"
  for d in $(seq 1 "$parts"); do echo "  run $d, with $dest_name/$d in the tree: bash $dest_name/$d/unpack.sh"; done
  echo "(each unpacks into /tmp/staged/flashinfer-$ver, where bench/peers_gpu.sh finds it; it unpacks a part carried with .peers itself)"
  echo "$whl_name sha256 $(sha256sum < "$whl" | cut -c1-64); module sources: $csrc"
  echo "data/aot/topk/topk.so: $(stat -c %s "$rel/flashinfer/data/aot/topk/topk.so") B, sha256 $mod_sum, code: $arch"
  echo "fallback wheels (installed on the host only where the module does not import):"
  sed -n 's/^wheel /  /p' "$tmp/extra-sums"
  [ ! -f "$cache/BUILD.txt" ] || { echo "The module's build:"; sed 's/^/  /' "$cache/BUILD.txt"; }
} > "$tmp/cut/MANIFEST.txt"

rm -rf "$dst"; mv "$tmp/cut" "$dst"

echo; (cd "$dst" && find . -type f | sort | xargs ls -l | awk '{printf "%12d  %s\n", $5, $NF}')
big=$(find "$dst" -type f -size +"${part_mib}"M)
[ -z "$big" ] || die "a part is over $part_mib MiB: $big"
echo; cat "$dst/MANIFEST.txt"
cat <<MSG

$dest_name holds $(( $(du -cb "$dst" | tail -1 | cut -f1) / 1048576 )) MiB. Each part travels in a run of its own (or with .peers and .whl, where
the 64 MiB a run carries holds them all: bench/peers_gpu.sh then unpacks it after .peers); once
unpacked in /tmp/staged/flashinfer-$ver, bench/peers.py runs every FlashInfer adapter that takes $ver
as NAME@flashinfer-$ver.
MSG
