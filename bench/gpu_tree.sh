#!/usr/bin/env bash
# The working tree a device call sends, cut to what a GPU session runs (the code, bench/*.py, tlm's shipped weights):
# a call takes at most 64 MiB, tracked files included, and the first call of a session brings TVM's compiler
# (bench/gpu_carry.sh). `slim` takes the data, results, docs, tests and the other weights out of git's index (the
# files stay on disk) and ignores them in .git/info/exclude, so the call leaves them behind; `restore` puts the
# index back as HEAD has it. Nothing is committed in between: restore before the next commit.
#
#   bash bench/gpu_tree.sh slim | restore
set -euo pipefail
cd "$(dirname "$0")/.."
EXCLUDE=.git/info/exclude
MARK="# bench/gpu_tree.sh slim"
LEFT=(datasets bench/results docs tests plugins/cdmpp_predictor/tunecore_cdmpp_predictor/weights
      plugins/tlm_generator/tunecore_tlm_generator/weights/tlm-base.pt)
case "${1:-}" in
  slim)
    git rm -r -q --cached "${LEFT[@]}"
    grep -q "^$MARK" "$EXCLUDE" 2>/dev/null || { echo "$MARK"; printf '/%s\n' "${LEFT[@]}"; } >> "$EXCLUDE"
    echo "tree: $(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1) bytes tracked";;
  restore)
    git reset -q HEAD -- "${LEFT[@]}"
    [ -f "$EXCLUDE" ] && sed -i "\|^$MARK|,\$d" "$EXCLUDE"
    git status --short | head;;
  *) echo "usage: bash bench/gpu_tree.sh slim | restore" >&2; exit 2;;
esac
