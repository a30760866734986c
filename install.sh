#!/usr/bin/env bash
# Install tunecore and every plugin under plugins/ into ./.venv (created if missing).
# Usage: bash install.sh            (then use .venv/bin/tunecore, or `source .venv/bin/activate`)
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
# System tools, when missing: what the ncu cost model's CPU profiler runs (valgrind, llvm-mca, objdump, a C
# compiler), and PostgreSQL for the shared store's tests (docs/fleet.md)
missing=()
for pair in valgrind:valgrind llvm-mca:llvm objdump:binutils cc:gcc; do
    command -v "${pair%%:*}" > /dev/null || missing+=("${pair##*:}")
done
if ! command -v initdb > /dev/null && ! ls /usr/lib/postgresql/*/bin/initdb > /dev/null 2>&1; then
    missing+=(postgresql)
fi
if [ ${#missing[@]} -gt 0 ]; then
    sudo=$([ "$(id -u)" = 0 ] || echo sudo)
    if ! { $sudo apt-get update -qq && $sudo apt-get install -y -qq "${missing[@]}"; } > /dev/null 2>&1; then
        echo "warning: could not install ${missing[*]} (apt-get install ${missing[*]}): the cpu profiler needs" \
             "valgrind, llvm, binutils and gcc; the shared-store tests need postgresql" >&2
    fi
fi
.venv/bin/python -m pip install --quiet --upgrade pip
plugins=()
for project in plugins/*/; do
    if [ -f "$project/pyproject.toml" ]; then
        plugins+=(-e "$project")
    fi
done
.venv/bin/python -m pip install --quiet -e ".[test,fleet,models]" "${plugins[@]}"
.venv/bin/tunecore plugins > /dev/null
echo "tunecore installed in $(pwd)/.venv with $(( ${#plugins[@]} / 2 )) plugin(s); run .venv/bin/tunecore --help"
