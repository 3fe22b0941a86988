#!/usr/bin/env bash
# check-install.sh BUILD_DIR MODEL.gguf — the install story, as an application sees it:
# `cmake --install` into a fresh prefix, then examples/embed.c built out of tree against it,
# once with pkg-config and once with find_package(loom), and each build run on MODEL, which
# must stream both of its requests to the end.
set -euo pipefail
cd "$(dirname "$0")/.."
build="$1" model="$2"
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" >/dev/null
pc_dir=$(dirname "$(find "$prefix" -name loom.pc)")
lib_dir=$(dirname "$pc_dir")

check_run() { # NAME PROGRAM: runs it, and wants two requests started and two finished
    local out
    out=$("$2" "$model")
    if [ "$(grep -c '(finished)$' <<<"$out")" != 2 ]; then
        echo "check-install: $1: the embed example did not finish both requests:" >&2
        echo "$out" >&2
        exit 1
    fi
    echo "check-install: $1: ok ($(grep -vc '(finished)$' <<<"$out") lines streamed)"
}

# pkg-config (the run finds libloom through LD_LIBRARY_PATH, as an unprivileged install would).
PKG_CONFIG_PATH="$pc_dir" cc -std=c11 -Wall -Wextra -Werror examples/embed.c \
    $(PKG_CONFIG_PATH="$pc_dir" pkg-config --cflags --libs loom) -o "$prefix/embed-pc"
LD_LIBRARY_PATH="$lib_dir" check_run pkg-config "$prefix/embed-pc"

# find_package(loom) -> loom::loom (CMake records the library's directory in the RPATH).
cmake -S examples/embed -B "$prefix/build-embed" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$prefix/build-embed" >/dev/null
check_run find_package "$prefix/build-embed/embed"
