#!/bin/bash
# Stages every kernels test (tests/kernels/kernels_*_test) + `strata` (built here for sm_90a) with
# their non-system shared libraries into <checkout>/.devwork/<name>/ for the device tool; then call
#   run(command="bash .devwork/<name>/run.sh", carry=[".devwork/<name>"])
# (run.sh takes BENCH_ONLY / BENCH_ITERS / TESTS from the environment, see kernels_run.sh).
# Usage: scripts/device/kernels_stage.sh BUILD_DIR CHECKOUT [NAME=kernels]
set -euo pipefail
build=$1
dest=$2/.devwork/${3:-kernels}
rm -rf "$dest"
mkdir -p "$dest/lib" "$dest/libcxx"
# strata (for the benchmarks) is optional: tests alone can run while it still builds.
[ -x "$build/cli/strata" ] && cp "$build/cli/strata" "$dest/"
cp "$build"/tests/kernels/kernels_*_test "$dest/"
strip "$dest"/strata "$dest"/kernels_*_test 2>/dev/null || strip "$dest"/kernels_*_test
for lib in $(ldd "$dest"/kernels_*_test $(ls "$dest"/strata 2>/dev/null) | awk '/=>/ {print $3}' | sort -u); do
  case $(basename "$lib") in
    libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*) ;;
    # Used only if the device's own C++ runtime is too old (run.sh falls back to these).
    libstdc++.so*|libgcc_s.so*) cp -L "$lib" "$dest/libcxx/" ;;
    *) cp -L "$lib" "$dest/lib/" ;;
  esac
done
# The device tool carries at most 64 MiB: ship the libraries compressed (run.sh unpacks them).
tar czf "$dest/lib.tgz" -C "$dest" lib libcxx && rm -rf "$dest/lib" "$dest/libcxx"
cp "$(dirname "$0")/kernels_run.sh" "$dest/run.sh"
du -sh "$dest"
