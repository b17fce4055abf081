#!/bin/bash
# Stages every `gpu`-labelled check of main for one device call: the CUDA backend test, the cuda
# transport test and bench, and `strata worker --backend cuda` serving a generate call
# (gpu_suite_run.sh). Libraries as cuda_stage.sh (CUDA's own come from the device). Then call
#   run(command="bash .devwork/<name>/run.sh", carry=[".devwork/<name>"])
# Usage: scripts/device/gpu_suite_stage.sh BUILD_DIR CHECKOUT [NAME=gpu]
set -euo pipefail
here=$(dirname "$0")
name=${3:-gpu}
bash "$here/cuda_stage.sh" "$1" "$2" "$name" > /dev/null
dest=$2/.devwork/$name
cp "$1/tests/transfer/transfer_cuda_test" "$dest/" && strip "$dest/transfer_cuda_test"
cp "$here/gpu_suite_run.sh" "$dest/run.sh"
du -sh "$dest"
