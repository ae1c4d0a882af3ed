#!/usr/bin/env bash
# Carry files larger than one GPU call allows (64 MiB with the tracked tree) to the lent GPU machine in
# chunks over consecutive calls, reassembled and sha256-checked there. Files written outside the repository
# on that machine stay while it is warm (idle release 30 s), so the calls must follow each other quickly.
#
# Here (the development machine):
#   bash tools/gpu/stage.sh pack DIR MIB FILE...
#     splits every FILE into parts of at most MIB MiB and groups the parts into DIR/call1, DIR/call2, … so
#     that no group exceeds MIB MiB; writes DIR/manifest (sha256, size, name of each FILE, name = basename)
#     and a copy of it into every group. DIR must be git-ignored (for example .gpu/stage); each group is
#     one call's `carry` entry. Prints the groups.
# There (each call, from the repository root):
#   bash tools/gpu/stage.sh take DIR/callN DEST     copies that group's parts into DEST/parts
#   bash tools/gpu/stage.sh join DEST               once every part is there: DEST/files/<name> for every
#                                                   file of the manifest, sha256-checked; exit 1 naming what is
#                                                   missing or corrupt (nothing half-written is left in files/)
# Example, the SmolLM2 GGUF and the three shipped drafters (tar) in groups of 48 MiB:
#   tar cf /tmp/init.tar -C models smollm2-135m-instruct-dflash smollm2-135m-instruct-dspark \
#       smollm2-135m-instruct-eagle3
#   bash tools/gpu/stage.sh pack .gpu/stage 48 models/smollm2-135m-instruct/*.gguf /tmp/init.tar
#   run (carry [".gpu/stage/call1"]): bash tools/gpu/stage.sh take .gpu/stage/call1 /root/stage
#   run (carry [".gpu/stage/call2"]): … take .gpu/stage/call2 /root/stage
#   run (carry [".gpu/stage/call3"]): … take .gpu/stage/call3 /root/stage && bash tools/gpu/stage.sh join /root/stage
set -euo pipefail

die() { echo "stage.sh: $*" >&2; exit 1; }

cmd=${1:-}
case "$cmd" in
pack)
  dir=${2:?pack DIR MIB FILE...}; mib=${3:?pack DIR MIB FILE...}; shift 3
  [ $# -gt 0 ] || die "pack: no files"
  [[ "$mib" =~ ^[0-9]+$ ]] && [ "$mib" -gt 0 ] || die "pack: MIB must be a positive integer, got '$mib'"
  limit=$((mib * 1024 * 1024))
  rm -rf "$dir"; mkdir -p "$dir/parts"
  : > "$dir/manifest"
  for f in "$@"; do
    [ -f "$f" ] || die "pack: $f is not a file"
    name=$(basename "$f")
    grep -q " $name\$" "$dir/manifest" && die "pack: two files named $name"
    echo "$(sha256sum "$f" | cut -d' ' -f1) $(stat -c %s "$f") $name" >> "$dir/manifest"
    split -b "$limit" -d -a 3 "$f" "$dir/parts/$name.part"
  done
  # first fit, in order: a group takes parts until the next would exceed the limit
  n=1; used=0; mkdir -p "$dir/call1"
  for p in "$dir"/parts/*; do
    s=$(stat -c %s "$p")
    if [ $((used + s)) -gt "$limit" ] && [ "$used" -gt 0 ]; then n=$((n + 1)); used=0; mkdir -p "$dir/call$n"; fi
    mv "$p" "$dir/call$n/"; used=$((used + s))
  done
  rmdir "$dir/parts"
  for g in "$dir"/call*; do
    cp "$dir/manifest" "$g/manifest"
    echo "$g: $(du -sh "$g" | cut -f1) $(ls "$g" | grep -vc manifest) parts"
  done
  ;;
take)
  src=${2:?take SRC DEST}; dest=${3:?take SRC DEST}
  [ -f "$src/manifest" ] || die "take: $src has no manifest (was it carried?)"
  mkdir -p "$dest/parts"
  if [ -f "$dest/manifest" ] && ! cmp -s "$src/manifest" "$dest/manifest"; then
    die "take: $dest holds parts of another manifest; remove it first"
  fi
  cp "$src/manifest" "$dest/manifest"
  for p in "$src"/*.part*; do cp "$p" "$dest/parts/"; done
  echo "stage.sh: $(ls "$dest/parts" | wc -l) parts in $dest/parts"
  ;;
join)
  dest=${2:?join DEST}
  [ -f "$dest/manifest" ] || die "join: $dest/manifest missing (no group taken yet)"
  mkdir -p "$dest/files"
  while read -r sum size name; do
    if [ -f "$dest/files/$name" ] && [ "$(stat -c %s "$dest/files/$name")" = "$size" ]; then
      continue  # joined by an earlier call (its sum was checked then)
    fi
    parts=$(ls "$dest/parts/$name".part* 2>/dev/null || true)
    [ -n "$parts" ] || die "join: no part of $name in $dest/parts (a group not taken?)"
    # shellcheck disable=SC2086
    cat $parts > "$dest/files/$name.tmp"
    got=$(stat -c %s "$dest/files/$name.tmp")
    if [ "$got" != "$size" ]; then
      rm -f "$dest/files/$name.tmp"; die "join: $name has $got of $size bytes (a group not taken?)"
    fi
    if [ "$(sha256sum "$dest/files/$name.tmp" | cut -d' ' -f1)" != "$sum" ]; then
      rm -f "$dest/files/$name.tmp"; die "join: $name: sha256 mismatch"
    fi
    mv "$dest/files/$name.tmp" "$dest/files/$name"
    echo "stage.sh: $dest/files/$name ($size bytes, sha256 ok)"
  done < "$dest/manifest"
  ;;
*)
  die "usage: stage.sh pack DIR MIB FILE... | take DIR/callN DEST | join DEST"
  ;;
esac
