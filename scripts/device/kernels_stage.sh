#!/bin/bash
# Stages the kernels gpu test + `strata` (built here for sm_90a) with their non-system shared
# libraries into <checkout>/.devwork/kernels/ for the device tool; then call
#   run(command="bash .devwork/kernels/run.sh", carry=[".devwork/kernels"])
# Usage: scripts/device/kernels_stage.sh BUILD_DIR CHECKOUT
set -euo pipefail
build=$1
dest=$2/.devwork/kernels
mkdir -p "$dest/lib" "$dest/libcxx"
cp "$build/cli/strata" "$build/tests/kernels/kernels_mla_decode_test" \
  "$build/tests/kernels/kernels_mla_decode_params_test" "$dest/"
strip "$dest/strata" "$dest/kernels_mla_decode_test" "$dest/kernels_mla_decode_params_test"
for lib in $(ldd "$dest/strata" "$dest/kernels_mla_decode_test" | awk '/=>/ {print $3}' | sort -u); do
  case $(basename "$lib") in
    libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*) ;;
    # Used only if the device's own C++ runtime is too old (run.sh falls back to these).
    libstdc++.so*|libgcc_s.so*) cp -L "$lib" "$dest/libcxx/" ;;
    *) cp -L "$lib" "$dest/lib/" ;;
  esac
done
cp "$(dirname "$0")/kernels_run.sh" "$dest/run.sh"
du -sh "$dest"
