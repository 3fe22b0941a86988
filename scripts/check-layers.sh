#!/usr/bin/env bash
# check-layers.sh — the dependency order of ARCHITECTURE.md, enforced on #include lines:
# each src/<layer> may include only the layers listed for it (arrows point down only; kv and
# sched never include each other; model computes only through backend/backend.h).
set -euo pipefail
cd "$(dirname "$0")/.."
declare -A allowed=(
    [core]="core"
    [tensor]="core tensor"
    [backend]="core tensor backend"
    [model]="core tensor backend model"
    [kv]="core tensor kv"
    [sched]="core sched"
    [sample]="core sample"
    [trace]="core trace"
    [engine]="core tensor backend model kv sched sample trace engine"
    [api]="core tensor backend model kv sched sample trace engine api"
)
bad=0
for layer in "${!allowed[@]}"; do
    [ -d "src/$layer" ] || continue
    while IFS=: read -r file line; do
        dep=$(sed -E 's/.*#include "([a-z_]+)\/.*/\1/' <<<"$line")
        if [[ " ${allowed[$layer]} " != *" $dep "* ]]; then
            echo "layering: $file includes $dep/ (allowed for $layer: ${allowed[$layer]})"
            bad=1
        fi
    done < <(grep -rHE '#include "[a-z_]+/' "src/$layer" || true)
done
for layer in src/*/; do
    name=$(basename "$layer")
    [ -n "${allowed[$name]+x}" ] || { echo "layering: src/$name has no rule"; bad=1; }
done
# The model reaches compute only through the vtable header.
if grep -rHE '#include "backend/cpu/' src/model src/engine src/api src/kv src/sched; then
    echo "layering: only the backend registry may include a backend implementation"
    bad=1
fi
[ $bad -eq 0 ] && echo "layering: ok"
exit $bad
