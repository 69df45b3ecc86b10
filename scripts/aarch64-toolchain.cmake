# CMake toolchain for cross-building cartridge for AArch64 Linux on Debian
# (used by scripts/test-aarch64.sh):
#   cmake -S . -B build-aarch64 -DCMAKE_TOOLCHAIN_FILE=scripts/aarch64-toolchain.cmake \
#         -DCART_BUILD_HOST=OFF
# Compiler: gcc-aarch64-linux-gnu. Libraries: Debian's multiarch arm64
# packages (libopenblas-dev:arm64, libcjson-dev:arm64) under
# /usr/lib/aarch64-linux-gnu and /usr/include[/aarch64-linux-gnu].
# Tests run through qemu-user (CMAKE_CROSSCOMPILING_EMULATOR), so ctest works
# unchanged.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)

# find_library / find_path search the host's multiarch tree for the target:
# CMAKE_LIBRARY_ARCHITECTURE makes CMake look in /usr/lib/aarch64-linux-gnu
# and /usr/include/aarch64-linux-gnu (before /usr/include) - where Debian's
# :arm64 -dev packages put their files. The cross compiler's own libc
# (libc6-dev-arm64-cross: libm.so and the C headers) lives under
# /usr/aarch64-linux-gnu, searched first as a find root.
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)
#
# The x86-64 multiarch directories must never satisfy an arm64 search (the
# CMakeLists' find_path for openblas_config.h lists an x86_64 suffix).
set(CMAKE_IGNORE_PATH
    /usr/lib/x86_64-linux-gnu /lib/x86_64-linux-gnu
    /usr/include/x86_64-linux-gnu /usr/include/x86_64-linux-gnu/openblas-pthread
    /usr/include/x86_64-linux-gnu/openblas-openmp /usr/include/x86_64-linux-gnu/openblas64-pthread)

# ctest (and anything else CMake runs for the target) goes through qemu. The
# guest's dynamic loader and libc must be one glibc build: the :arm64 packages
# pull in libc6:arm64 (/lib/ld-linux-aarch64.so.1, /lib/aarch64-linux-gnu),
# and the host's ld.so.cache sends the loader to that libc.so.6. So the guest
# root is / - not -L /usr/aarch64-linux-gnu, whose loader (the cross libc,
# another glibc build) paired with libc6:arm64's libc hangs in the first
# pthread_create (OpenBLAS starts its threads before main).
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64 -L /)
