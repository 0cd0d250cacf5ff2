#!/usr/bin/env bash
# Stage one release of vLLM's kernel libraries (the staged .vllm/: _C_stable_libtorch.abi3.so.xz, about 60
# MiB, and _deepselect_C.abi3.so.xz, 2 MiB, with VERSION, e.g. `vllm==0.34.0`, as
# ../shared/gpu/vllm-kernels VERSION writes them) for an offline GPU host that takes the working tree and
# at most about 64 MiB with it per run: too much for one run beside the tree. Run from the project root
# after .vllm/ was staged (nothing is downloaded):
#   bash staging/stage_vllm.sh                            (writes .vllm-parts/)
#   DEST=.vllm-parts-0.34.0 bash staging/stage_vllm.sh    (a second release beside the first)
# It writes $DEST (git-ignored, replaced on each run; default .vllm-parts): one tar of the two .xz files
# and VERSION cut by staging/parts.sh into parts of at most $PART_MIB MiB (default 46: a part and the tree of about
# 15 MiB fit the 64 MiB of one run; 0.33.0 makes parts of 46 and 16.4 MiB, 0.34.0 of 46 and 11.9), part N in
# $DEST/N/ with unpack.sh, parts.sh and SHA256SUMS (the parts', the tar's and the decompressed
# libraries'), and MANIFEST.txt. Each part travels in a run of its own; unpack.sh keeps the parts in
# DIR/parts and, once it has them all, lays the release out in DIR (default /tmp/staged/vllm-VERSION) as
# a staged release: DIR/vllm/_C_stable_libtorch.abi3.so and DIR/vllm/_deepselect_C.abi3.so (each checked
# against the sha256 of `xz -dc` of its .xz here; `vllm` has no __init__.py, so the adapters import the
# libraries from DIR where vLLM puts them), DIR/vllm-VERSION.dist-info/METADATA (the release's name and
# version, which the adapters read) and DIR/VERSION. bench/fidelity_gpu.sh reads the 0.33.0 one,
# bench/peers.py every one under /tmp/staged (--staged). Where the host clears /tmp soon after a run, the
# runs must follow one another (.vllm itself stays behind; GPU_TESTS=none: no kernel tests, see
# fidelity_gpu.sh):
#   run 1, with .vllm-parts/1 in the tree:          bash .vllm-parts/1/unpack.sh
#   run 2, with .vllm-parts/2 and .whl in the tree: bash .vllm-parts/2/unpack.sh &&
#                                                   GPU_TESTS=none bash bench/fidelity_gpu.sh indexer,indexer-decode
# Later runs on the same host (before it clears /tmp) need neither part: fidelity_gpu.sh finds the files.
# Needs tar, xz, split, numfmt and sha256sum.
set -euo pipefail
part_mib=${PART_MIB:-46}
root=$(git rev-parse --show-toplevel)
src="$root/.vllm"
dst="$root/${DEST:-.vllm-parts}"
libs="_C_stable_libtorch.abi3.so _deepselect_C.abi3.so"
for f in $libs; do
  [ -f "$src/$f.xz" ] || { echo "stage_vllm: no $src/$f.xz (stage vLLM's libraries in .vllm/ first)" >&2; exit 1; }
done
[ -f "$src/VERSION" ] || { echo "stage_vllm: no $src/VERSION" >&2; exit 1; }
ver=$(sed -n 's/^vllm==\([0-9][0-9A-Za-z.+]*\)$/\1/p' "$src/VERSION")
[ -n "$ver" ] || { echo "stage_vllm: $src/VERSION does not say vllm==VERSION" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
out="$tmp/out"   # written by parts.sh cut, moved to .vllm-parts/ once complete
mkdir -p "$tmp/payload"

echo "== checking and summing the libraries ($(cat "$src/VERSION"))"
for f in $libs; do
  xz -t "$src/$f.xz"
  echo "lib $(xz -dc "$src/$f.xz" | sha256sum | cut -c1-64)  $f"
  cp "$src/$f.xz" "$tmp/payload/"
done > "$tmp/lib-sums"   # in each part's SHA256SUMS, read by unpack.sh
cp "$src/VERSION" "$tmp/payload/"
cat "$tmp/lib-sums"

echo "== one tar, cut into parts of at most $part_mib MiB"
# A tar whose bytes depend only on the files (names sorted, owner and times fixed), so the parts' sums are
# the same on every run.
tar -C "$tmp/payload" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -cf "$tmp/vllm.tar" .

cat > "$tmp/unpack.sh" <<'EOF'
#!/usr/bin/env bash
# One part of a release of vLLM's kernel libraries, staged by staging/stage_vllm.sh, on the GPU host (no
# network). From the project root, one run per part, the runs following one another (before the host
# clears /tmp):
#   bash .vllm-parts/N/unpack.sh [DIR]      (DIR defaults to /tmp/staged/vllm-VERSION)
# Keeps this part in DIR/parts (unpack_part of parts.sh, beside this script); once every part is there,
# joins them into DIR/vllm.tar (checked) and lays out the staged release: DIR/vllm/_C_stable_libtorch.abi3.so
# and DIR/vllm/_deepselect_C.abi3.so, each checked against its sum before it takes its name,
# DIR/vllm-VERSION.dist-info/METADATA and DIR/VERSION.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
sums=$(sed -n 's/^lib //p' "$here/SHA256SUMS")
[ -n "$sums" ] || { echo "unpack.sh: $here/SHA256SUMS lists no library" >&2; exit 1; }
unpacked() {  # every library in place, as summed
  (cd "$T/vllm" 2> /dev/null && printf '%s\n' "$sums" | sha256sum -c --quiet --strict) > /dev/null 2>&1 &&
    echo "vLLM's libraries already unpacked in $T ($(cat "$T/VERSION" 2>/dev/null))"
}
. "$here/parts.sh"
# sets rel and T; exits 0 where unpacked already or while parts are missing
unpack_part "$here" "/tmp/staged/vllm-{release}" unpacked "${1:-}"
rm -rf "$T/xz"; mkdir -p "$T/xz" "$T/vllm" "$T/vllm-$rel.dist-info"
tar -C "$T/xz" -xf "$T/vllm.tar"
printf '%s\n' "$sums" | while read -r sum name; do
  xz -dc "$T/xz/$name.xz" > "$T/vllm/.$name.new"
  [ "$(sha256sum < "$T/vllm/.$name.new" | cut -c1-64)" = "$sum" ] ||
    { rm -f "$T/vllm/.$name.new"; echo "unpack.sh: $name does not match its sum" >&2; exit 1; }
  mv "$T/vllm/.$name.new" "$T/vllm/$name"
done
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s\n' "$rel" > "$T/vllm-$rel.dist-info/METADATA"
cp "$T/xz/VERSION" "$T/VERSION"
rm -rf "$T/xz" "$T/vllm.tar"
echo "vLLM's libraries ($(cat "$T/VERSION")) unpacked into $T as a staged release, sha256 checked:"
(cd "$T/vllm" && printf '%s\n' "$sums" | while read -r _ name; do echo "  $(stat -c %s "$name")  $T/vllm/$name"; done)
echo "next: bash bench/fidelity_gpu.sh SUITES (0.33.0) or bash bench/peers_gpu.sh (every release in /tmp/staged)"
EOF
echo "release $ver" >> "$tmp/lib-sums"
parts=$(bash "$root/staging/parts.sh" cut "$tmp/vllm.tar" "$out" "${part_mib}M" "$tmp/lib-sums" "$tmp/unpack.sh")

{
  name=$(basename "$dst")
  echo "vLLM $ver's kernel libraries, staged by staging/stage_vllm.sh: $parts parts, one run each, in order:"
  for d in $(seq 1 "$parts"); do
    echo "  run $d, with $name/$d$([ "$d" = "$parts" ] && echo ' and .whl') in the tree: bash $name/$d/unpack.sh$(
      [ "$d" = "$parts" ] && echo ' && GPU_TESTS=none bash bench/fidelity_gpu.sh indexer,indexer-decode')"
  done
  echo "(each unpacks into /tmp/staged/vllm-$ver, where bench/peers_gpu.sh finds it)"
  echo "$(cat "$src/VERSION"); files (bytes, sha256):"
  (cd "$tmp/payload" && for f in *; do echo "  $(stat -c %s "$f")  $(sha256sum "$f" | cut -c1-64)  $f"; done)
  echo "decompressed (sha256):"
  sed -n 's/^lib /  /p' "$tmp/lib-sums"
} > "$out/MANIFEST.txt"

rm -rf "$dst"; mv "$out" "$dst"

echo; (cd "$dst" && find . -type f | sort | xargs ls -l | awk '{printf "%12d  %s\n", $5, $NF}')
big=$(find "$dst" -type f -size +"${part_mib}"M)
[ -z "$big" ] || { echo "stage_vllm: a part is over $part_mib MiB: $big" >&2; exit 1; }
echo; cat "$dst/MANIFEST.txt"
cat <<MSG

Each run takes one part (with the working tree: keep each under 64 MiB; leave .vllm out of the carry).
After the last, the release is laid out in /tmp/staged/vllm-$ver (bench/fidelity_gpu.sh reads 0.33.0's,
bench/peers_gpu.sh every release there).
MSG
