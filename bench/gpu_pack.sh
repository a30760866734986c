#!/usr/bin/env bash
# Makes the carried folder of one device call (docs/gpu.md, "Next time a GPU is lent"): TVM's runtime, the tvm-ffi
# wheel and the entry points (from bench/gpu_carry.sh), then each named directory of .gpu/ as xz, in the order given
# (bench/gpu_batches.sh times the batches in that order and profiles the first). A batch travels with its
# results.json and profiles.json, so that the device resumes it; never with its libraries' cubins (made there).
# A name ending in .db is a store, carried as NAME.xz (the one bench/gpu_round_network.sh starts from).
#
#   bash bench/gpu_pack.sh OUT_DIR b-bert1 b-resnet18 net-r18-v2 h100.db ...
set -euo pipefail
cd "$(dirname "$0")/.."
UP=${1:?the folder to make, e.g. .gpu/up3}; shift
mkdir -p "$UP"
cp -n .whl/apache_tvm_ffi*.whl .gpu/tvm-runtime.tar.xz .gpu/dist-info.tar "$UP"/
n=0
for name in "$@"; do
  if [[ $name == *.db ]]; then  # a store (the one a search round was searched from), as xz
    [ -f "$UP/$name.xz" ] || { xz -T2 -6 -c ".gpu/$name" > "$UP/$name.xz.part" \
      && mv "$UP/$name.xz.part" "$UP/$name.xz"; }
    continue
  fi
  [ -e ".gpu/$name/manifest.json" ] || [ -e ".gpu/$name/network.json" ] || { echo "no batch or network: .gpu/$name" >&2; exit 2; }
  n=$((n + 1)); as=$name; [[ $name == b-* ]] && as="b-$n-${name#b-}"
  [ -f "$UP/$as.tar.xz" ] || { tar -C .gpu -cf - --exclude=cubins --transform "s,^$name,$as," "$name" \
    | xz -T2 -6 > "$UP/$as.tar.xz.part" && mv "$UP/$as.tar.xz.part" "$UP/$as.tar.xz"; }
done
tree=$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
untracked=$(git ls-files -z --others --exclude-standard | xargs -0 -r du -cb | tail -1 | cut -f1)
echo "carry [\"$UP\"]: $(du -sb "$UP" | cut -f1) bytes; with the tree $(( $(du -sb "$UP" | cut -f1) + tree + ${untracked:-0} )) of 67108864"
