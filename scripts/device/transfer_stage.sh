#!/bin/bash
# Stages the cuda transport's gpu test + `strata` (built here for sm_90a) with their non-system
# shared libraries into <checkout>/.devwork/<name>/ for the device tool; then call
#   run(command="bash .devwork/<name>/run.sh", carry=[".devwork/<name>"])
# Usage: scripts/device/transfer_stage.sh BUILD_DIR CHECKOUT [NAME=xfer]
set -euo pipefail
build=$1
dest=$2/.devwork/${3:-xfer}
rm -rf "$dest"
source "$(dirname "$0")/bundle.sh"
bundle_binaries "$dest" "$build/cli/strata" "$build/tests/transfer/transfer_cuda_test"
cp "$(dirname "$0")/transfer_run.sh" "$dest/run.sh"
du -sh "$dest"
