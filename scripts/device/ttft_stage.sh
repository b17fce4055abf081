#!/bin/bash
# Stages the TTFT device run (ttft_run.sh): `strata` (built here for sm_90a) with its non-system
# shared libraries into <checkout>/.devwork/<name>/; then call
#   run(command="LAYERS=8 N=4096 bash .devwork/<name>/run.sh", carry=[".devwork/<name>"])
# ttft_run.sh also runs here without a GPU: STRATA=build/cli/strata BACKEND=cpu PRESET=tiny
# LAYERS=0 N=700 scripts/device/ttft_run.sh
# Usage: scripts/device/ttft_stage.sh BUILD_DIR CHECKOUT [NAME=ttft]
set -euo pipefail
build=$1
dest=$2/.devwork/${3:-ttft}
rm -rf "$dest"
source "$(dirname "$0")/bundle.sh"
bundle_binaries "$dest" "$build/cli/strata"
cp "$(dirname "$0")/ttft_run.sh" "$dest/run.sh"
du -sh "$dest"
