#!/bin/sh
# Cross-builds the C engine and its C tests for AArch64 and runs the tests
# under qemu-user, so the neon and neondot levels (engine/kernels/neon.c,
# neondot.c) are compiled and checked against the scalar level
# (tests/c/test_kernels.c) on an x86 machine.
#
# On Debian as root it installs what is missing (the arm64 architecture, the
# cross compiler, qemu-user and the :arm64 libraries the engine links);
# otherwise it prints the exact commands to run and exits 1 when something is
# missing. No standard input is read (CI calls it from .ci/run).
#
# Usage: scripts/test-aarch64.sh [BUILD_DIR]   (default build-aarch64)
# The toolchain is scripts/aarch64-toolchain.cmake; the LuaJIT host is not
# built (-DCART_BUILD_HOST=OFF), nor MPI (-DCART_MPI=OFF: the Open MPI installed
# is the host's, x86-64).
set -eu
cd "$(dirname "$0")/.."
build=${1:-build-aarch64}
export DEBIAN_FRONTEND=noninteractive
t0=$(date +%s)

# ---- install ----------------------------------------------------------------
# Host tools (amd64) and the arm64 libraries the engine links (multiarch).
PACKAGES="cmake make gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user libc6:arm64 libopenblas-dev:arm64 libcjson-dev:arm64"

need_arch=0
dpkg --print-foreign-architectures 2>/dev/null | grep -qx arm64 || need_arch=1
missing=""
for pkg in $PACKAGES; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $pkg"
    fi
done

if [ -n "$missing" ] || [ "$need_arch" -eq 1 ]; then
    echo "test-aarch64: missing Debian packages:${missing:- none}"
    if [ "$(id -u)" -ne 0 ]; then
        echo "test-aarch64: run this as root, or install them yourself with:"
        if [ "$need_arch" -eq 1 ]; then echo "  sudo dpkg --add-architecture arm64"; fi
        echo "  sudo apt-get update && sudo apt-get install -y --no-install-recommends$missing"
        exit 1
    fi
    if [ "$need_arch" -eq 1 ]; then dpkg --add-architecture arm64; fi
    apt-get update
    # shellcheck disable=SC2086 # one word per package
    if [ -n "$missing" ]; then apt-get install -y --no-install-recommends $missing; fi
    echo "test-aarch64: installed$missing"
else
    echo "test-aarch64: all dependencies are installed ($PACKAGES)"
fi
t1=$(date +%s)

# ---- build ------------------------------------------------------------------
cmake -S . -B "$build" -DCMAKE_TOOLCHAIN_FILE="$PWD/scripts/aarch64-toolchain.cmake" \
    -DCMAKE_BUILD_TYPE=Release -DCART_BUILD_HOST=OFF -DCART_BUILD_TESTS=ON -DCART_MPI=OFF
# The arm64 libraries, not the host's (both may be installed): refuse a mix.
for var in OPENBLAS_INCLUDE_DIR OPENBLAS_LIBRARY CJSON_LIBRARY MATH_LIBRARY; do
    value=$(sed -n "s/^$var:[A-Z]*=//p" "$build/CMakeCache.txt")
    case "$value" in
    *aarch64-linux-gnu*) echo "test-aarch64: $var=$value" ;;
    *)
        echo "test-aarch64: $var=$value is not the arm64 one (expected under */aarch64-linux-gnu/*)" >&2
        exit 1
        ;;
    esac
done
cmake --build "$build" -j"$(nproc)"
t2=$(date +%s)

# ---- tests ------------------------------------------------------------------
# Each test runs through qemu-aarch64 (CMAKE_CROSSCOMPILING_EMULATOR); the
# test@scalar, test@neon and test@neondot entries force each level with
# CART_ISA (qemu-user's default CPU has the dot-product instructions).
status=0
# The plain runs of those tests repeat the best level: -LE skips them.
# Under qemu (about ten times slower than native) the whole-model tests run at
# the neon levels only: their code outside the kernels is the same at every
# level, and the scalar kernels are the same C the native run checks, checked
# here too by the kernel tests at every level (dtype, matmul, qdot, kernels,
# tensor). quant, gemma4 and model at scalar took 460 of the 966 s.
ctest --test-dir "$build" --output-on-failure -j"$(nproc)" -LE best-level-again \
    -E '^(model|quant|gemma4|train|params|draft)@scalar$' || status=$?
t3=$(date +%s)

echo "test-aarch64: install $((t1 - t0)) s, build $((t2 - t1)) s, tests $((t3 - t2)) s, total $((t3 - t0)) s"
exit "$status"
