#!/usr/bin/env bash
# check-format.sh — every C, C++ and CUDA source tracked by git is formatted as .clang-format
# says, by the clang-format pinned in python/requirements.txt (the venv's: versions format
# differently, so the check must use one). Generated files are skipped. Prints the files that
# differ and exits 1; `scripts/check-format.sh --fix` formats them instead.
set -euo pipefail
cd "$(dirname "$0")/.."
CF=.venv/bin/clang-format
[ -x "$CF" ] || { echo "check-format: $CF missing (run scripts/setup-python.sh)"; exit 1; }
mapfile -t files < <(git ls-files '*.c' '*.h' '*.cpp' '*.cu' '*.cuh' |
                     grep -v '^src/tokenizer/unicode_tables.c$')
if [ "${1:-}" = "--fix" ]; then
    "$CF" -i "${files[@]}"
    exit 0
fi
bad=()
for f in "${files[@]}"; do
    "$CF" --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if [ ${#bad[@]} -gt 0 ]; then
    echo "check-format: not formatted ($("$CF" --version | head -1)); scripts/check-format.sh --fix:"
    printf '  %s\n' "${bad[@]}"
    exit 1
fi
echo "check-format: ${#files[@]} files formatted"
