#!/usr/bin/env bash
# One file carried to an offline GPU host in parts, one run per part (each run takes the working tree and
# at most about 64 MiB with it), reassembled there and checked by sha256. Used by the staging scripts
# (staging/README.md); nothing here knows what the file holds.
#
#   bash staging/parts.sh cut FILE DEST SIZE [EXTRA_SUMS [UNPACK]]
#     Cuts FILE into parts of at most SIZE bytes (split's syntax: 54M is 54 MiB, 4K is 4 KiB) and writes
#     DEST/1/, DEST/2/, ... (DEST must not exist yet), each with its part NAME.partK (NAME: FILE's base
#     name; K from 0), a copy of this script (parts.sh), SHA256SUMS and, where given, a copy of UNPACK
#     (a payload's unpack.sh, which calls unpack_part below). SHA256SUMS, the same in every part: one
#     `SUM  NAME.partK` line per part, in order, `whole SUM  NAME` for the reassembled file, then the lines
#     of EXTRA_SUMS (the payload's own, e.g. `wheel SUM  FILE`: left to UNPACK). Prints the part count.
#
#   bash parts.sh join HERE DIR
#     On the host, from one part's directory HERE: checks HERE's part against SHA256SUMS and keeps it in
#     DIR/parts. Exits 10, saying which parts are missing, while some are; once all are there (in any
#     order, over any number of runs), checks them, writes DIR/NAME (checked against its whole sum),
#     removes DIR/parts and exits 0. A later join finds DIR/NAME checked and exits 0 at once. Any other
#     exit status is an error (a damaged part or file, a full disk).
#
#   . "$here/parts.sh"; unpack_part HERE DEFAULT CHECK [DIR]
#     The steps every payload's unpack.sh (in HERE, beside this script) takes before its own unpacking,
#     sourced so that they set rel and T in it. rel: the release HERE/SHA256SUMS names (its `release REL`
#     line; an error where it has none and DEFAULT names {release}). T: DIR, else DEFAULT with {release}
#     replaced by rel, made and resolved to an absolute path; / is refused. Then exits 0 where the command
#     CHECK (run with rel and T set) says, itself, that the payload is unpacked in T already; else keeps
#     this part in T/parts (join), exits 0 while some parts are missing (join's 10) and with join's status
#     on an error, and returns once T/NAME is whole and checked, for the payload's own unpacking.
# Needs split, numfmt, sha256sum, awk and stat.
set -eu

die() { echo "parts.sh: $*" >&2; exit 1; }

cut_file() {
  local file=$1 dest=$2 size=$3 extra=${4:-} unpack=${5:-}
  [ -f "$file" ] || die "no file $file"
  [ ! -e "$dest" ] || die "$dest exists already"
  [ -z "$extra" ] || [ -f "$extra" ] || die "no sums file $extra"
  [ -z "$unpack" ] || [ -f "$unpack" ] || die "no unpack script $unpack"
  local name self bytes total count last digits tmp p d
  name=$(basename "$file")
  self=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
  bytes=$(numfmt --from=iec "$size" 2>/dev/null) && [ "$bytes" -gt 0 ] ||
    die "part size $size: give bytes, or K, M or G (KiB, MiB, GiB)"
  total=$(stat -c %s "$file")
  count=$(( total == 0 ? 1 : (total + bytes - 1) / bytes ))
  last=$((count - 1)); digits=${#last}
  mkdir -p "$dest"
  tmp=$(cd "$dest" && pwd)/.cut
  mkdir "$tmp"
  # NAME.part0 ... NAME.part9 for up to ten parts, NAME.part00 ... for up to a hundred, and so on.
  split -b "$bytes" -d -a "$digits" "$file" "$tmp/$name.part"
  [ "$total" != 0 ] || : > "$tmp/$name.part0"  # an empty file is one empty part
  [ "$(ls "$tmp" | wc -l)" = "$count" ] || die "split made $(ls "$tmp" | wc -l) parts, not $count"
  {
    for p in $(ls "$tmp" | LC_ALL=C sort); do (cd "$tmp" && sha256sum -- "$p"); done
    echo "whole $(sha256sum < "$file" | cut -c1-64)  $name"
    [ -z "$extra" ] || cat "$extra"
  } > "$dest/.SHA256SUMS"
  d=0
  for p in $(ls "$tmp" | LC_ALL=C sort); do
    d=$((d + 1))
    mkdir "$dest/$d"
    mv "$tmp/$p" "$dest/$d/"
    cp "$dest/.SHA256SUMS" "$dest/$d/SHA256SUMS"
    cp "$self" "$dest/$d/parts.sh"
    [ -z "$unpack" ] || { cp "$unpack" "$dest/$d/unpack.sh"; chmod +x "$dest/$d/unpack.sh"; }
  done
  rm -rf "$tmp" "$dest/.SHA256SUMS"
  echo "$count"
}

join_parts() {
  local here=$1 dir=$2 name sum list missing all p b line
  here=$(cd "$here" && pwd)
  [ -f "$here/SHA256SUMS" ] || die "no SHA256SUMS in $here"
  name=$(sed -n 's/^whole [0-9a-f]\{64\}  //p' "$here/SHA256SUMS")
  sum=$(sed -n 's/^whole \([0-9a-f]\{64\}\)  .*/\1/p' "$here/SHA256SUMS")
  [ -n "$name" ] && [ "$(echo "$name" | wc -l)" = 1 ] || die "$here/SHA256SUMS names no single whole file"
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  [ "$dir" != / ] || die "refusing to reassemble into /"
  if [ -f "$dir/$name" ] && [ "$(sha256sum < "$dir/$name" | cut -c1-64)" = "$sum" ]; then
    echo "$name already reassembled in $dir"; return 0
  fi
  list=$(awk -v n="$name" 'NF == 2 && length($1) == 64 && $1 ~ /^[0-9a-f]+$/ && index($2, n ".part") == 1 &&
                             substr($2, length(n) + 6) ~ /^[0-9]+$/' "$here/SHA256SUMS")
  [ -n "$list" ] || die "$here/SHA256SUMS lists no part of $name"
  mkdir -p "$dir/parts"
  printf '%s\n' "$list" > "$dir/parts/SHA256SUMS"
  for p in "$here/$name".part*; do
    [ -f "$p" ] || continue
    b=$(basename "$p")
    line=$(printf '%s\n' "$list" | awk -v b="$b" '$2 == b')
    [ -n "$line" ] && (cd "$here" && printf '%s\n' "$line" | sha256sum -c --quiet --strict) ||
      die "$p is damaged (or not listed in $here/SHA256SUMS)"
    cp "$p" "$dir/parts/.$b.new"
    mv "$dir/parts/.$b.new" "$dir/parts/$b"
  done
  missing=$(cd "$dir/parts" && sha256sum -c SHA256SUMS 2>/dev/null | grep -v ': OK$' | cut -d: -f1 | xargs) || true
  if [ -n "$missing" ]; then
    all=$(printf '%s\n' "$list" | wc -l)
    echo "kept $(basename "$here")/$(cd "$here" && ls -- "$name".part* 2>/dev/null | xargs) in $dir/parts" \
      "($((all - $(echo "$missing" | wc -w))) of $all parts; missing: $missing)." \
      "Run the other parts' unpack.sh next, before the host clears /tmp"
    return 10
  fi
  (cd "$dir/parts" && cat $(printf '%s\n' "$list" | sed 's/^[0-9a-f]*  //')) > "$dir/.$name.new"
  [ "$(sha256sum < "$dir/.$name.new" | cut -c1-64)" = "$sum" ] ||
    { rm -f "$dir/.$name.new"; die "the parts in $dir/parts do not make $name (whole sum differs)"; }
  mv "$dir/.$name.new" "$dir/$name"
  rm -rf "$dir/parts"
  echo "$name reassembled in $dir ($(stat -c %s "$dir/$name") bytes, sha256 checked)"
}

unpack_part() {
  local here=$1 default=$2 check=$3 dir=${4:-} rc=0
  rel=$(sed -n 's/^release //p' "$here/SHA256SUMS")
  [ -n "$rel" ] || [[ $default != *"{release}"* ]] ||
    { echo "unpack.sh: $here/SHA256SUMS names no release" >&2; exit 1; }
  dir=${dir:-${default//"{release}"/$rel}}
  T=$(mkdir -p "$dir" && cd "$dir" && pwd)
  [ "$T" != / ] || { echo "unpack.sh: refusing to unpack into /" >&2; exit 1; }
  if "$check"; then exit 0; fi
  bash "$here/parts.sh" join "$here" "$T" || rc=$?  # keeps this part; 10: others still missing
  [ "$rc" != 10 ] || exit 0
  [ "$rc" = 0 ] || exit "$rc"
}

[ "${BASH_SOURCE[0]}" = "$0" ] || return 0  # sourced by an unpack.sh: the functions only
case "${1:-}" in
  cut) shift; [ "$#" -ge 3 ] || die "usage: parts.sh cut FILE DEST SIZE [EXTRA_SUMS [UNPACK]]"; cut_file "$@" ;;
  join) shift; [ "$#" = 2 ] || die "usage: parts.sh join HERE DIR"; join_parts "$@" ;;
  *) die "usage: parts.sh cut FILE DEST SIZE [EXTRA_SUMS [UNPACK]] | parts.sh join HERE DIR" ;;
esac
