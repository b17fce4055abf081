#!/bin/bash
# Stages the decode-step device run (issue #9): `strata`, compute_nodes_cuda_engine_test,
# and the kernel tests of what a decode step runs (moe_experts, mla_decode, norm_act, rope,
# moe_router) (built here for sm_90a) with their non-system shared libraries, and
# decode_run.sh, into <checkout>/.devwork/<name>/; then call
#   run(command="bash .devwork/<name>/run.sh", carry=[".devwork/<name>"])
# Usage: scripts/device/decode_stage.sh BUILD_DIR CHECKOUT [NAME=decode]
set -euo pipefail
build=$1
dest=$2/.devwork/${3:-decode}
rm -rf "$dest"
source "$(dirname "$0")/bundle.sh"
bundle_binaries "$dest" "$build/cli/strata" "$build/tests/compute_nodes/compute_nodes_cuda_engine_test" \
  "$build"/tests/kernels/kernels_{moe_experts,mla_decode,norm_act,rope,moe_router}_test
cp "$(dirname "$0")/decode_run.sh" "$dest/run.sh"
du -sh "$dest"
