#!/bin/bash
# Stages every `gpu`-labelled check of main for one device call: the kernel tests, the CUDA
# backend test, the cuda transport test and bench, `strata worker --backend cuda` serving a
# generate call, the KV-pool, decode-step, whole-model prefill, attention-kernel and sampler
# benches (gpu_suite_run.sh; ~6 minutes with the default DEADLINE of 560 s), built here for
# sm_90a, into <checkout>/.devwork/<name>/; then call
#   run(command="bash .devwork/<name>/run.sh", carry=[".devwork/<name>"])
# The logs and JSON reports come back as one archive, suite.tgz (tar xzf it under files_at).
# Usage: scripts/device/gpu_suite_stage.sh BUILD_DIR CHECKOUT [NAME=gpu]
set -euo pipefail
build=$1
dest=$2/.devwork/${3:-gpu}
rm -rf "$dest"
source "$(dirname "$0")/bundle.sh"
# The kernel tests ctest labels gpu (not every kernels_*_test file in the build: a binary left
# there by another branch is not main's); the *_params_test ones check launch arguments on the
# CPU (ctest runs them here), and leaving them out keeps the stage plus the working tree under
# the device tool's 64 MiB.
kernel_tests=$(ctest --test-dir "$build" -N -L '^gpu$' | awk '$3 ~ /^kernels_/ {print $3}' |
  sed "s|^|$build/tests/kernels/|")
bundle_binaries "$dest" "$build/cli/strata" \
  "$build/tests/compute_nodes/compute_nodes_cuda_engine_test" \
  "$build/tests/compute_nodes/compute_nodes_device_kv_pool_test" \
  "$build/tests/transfer/transfer_cuda_test" $kernel_tests
cp "$(dirname "$0")/gpu_suite_run.sh" "$dest/run.sh"
du -sh "$dest"
