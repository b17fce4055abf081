#!/bin/bash
# Stages the CUDA backend's device run: `strata` and compute_nodes_cuda_engine_test (built here for
# sm_90a), their non-system shared libraries except CUDA's own (cuBLAS alone is > 64 MiB; the
# device image has the same CUDA 13.0), scripts/device/hf_compare_cuda.py and cuda_run.sh, into
# <checkout>/.devwork/<name>/; then call
#   run(command="bash .devwork/<name>/run.sh", carry=[".devwork/<name>"])
# Usage: scripts/device/cuda_stage.sh BUILD_DIR CHECKOUT [NAME=cuda]
set -euo pipefail
build=$1
dest=$2/.devwork/${3:-cuda}
rm -rf "$dest"
source "$(dirname "$0")/bundle.sh"
bundle_binaries "$dest" "$build/cli/strata" "$build/tests/compute_nodes/compute_nodes_cuda_engine_test"
cp "$(dirname "$0")/cuda_run.sh" "$dest/run.sh"
cp "$(dirname "$0")/hf_compare_cuda.py" "$dest/"
du -sh "$dest"
