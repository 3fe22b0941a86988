#!/usr/bin/env bash
# pack-deps.sh — fills .gpu-deps/ (git-ignored) with what the GPU machine lacks and cannot
# fetch (it has no network): cmocka's header and library, from this machine's Debian package.
# Carry it to the device with the run (carry: [".gpu-deps"]); bench/gpu/check.sh uses it.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .gpu-deps/include .gpu-deps/lib
cp /usr/include/cmocka.h .gpu-deps/include/
cp -L /usr/lib/x86_64-linux-gnu/libcmocka.so.0 .gpu-deps/lib/libcmocka.so.0
ln -sf libcmocka.so.0 .gpu-deps/lib/libcmocka.so
du -sh .gpu-deps
