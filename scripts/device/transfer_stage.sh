#!/bin/bash
# Stages the cuda transport's gpu test + `strata` (built here for sm_90a) with their non-system
# shared libraries into <checkout>/.devwork/<name>/ for the device tool; then call
#   run(command="bash .devwork/<name>/run.sh", carry=[".devwork/<name>"])
# Usage: scripts/device/transfer_stage.sh BUILD_DIR CHECKOUT [NAME=xfer]
set -euo pipefail
build=$1
dest=$2/.devwork/${3:-xfer}
rm -rf "$dest"
mkdir -p "$dest/lib" "$dest/libcxx"
cp "$build/cli/strata" "$build/tests/transfer/transfer_cuda_test" "$dest/"
strip "$dest/strata" "$dest/transfer_cuda_test"
for lib in $(ldd "$dest/strata" "$dest/transfer_cuda_test" | awk '/=>/ {print $3}' | sort -u); do
  case $(basename "$lib") in
    libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*) ;;
    libstdc++.so*|libgcc_s.so*) cp -L "$lib" "$dest/libcxx/" ;;
    *) cp -L "$lib" "$dest/lib/" ;;
  esac
done
tar czf "$dest/lib.tgz" -C "$dest" lib libcxx && rm -rf "$dest/lib" "$dest/libcxx"
cp "$(dirname "$0")/transfer_run.sh" "$dest/run.sh"
du -sh "$dest"
