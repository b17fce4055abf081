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
source "$(dirname "$0")/bundle.sh"
# strata (for the benchmarks) is optional: tests alone can run while it still builds.
bundle_binaries "$dest" "$build"/tests/kernels/kernels_*_test $(ls "$build/cli/strata" 2>/dev/null)
cp "$(dirname "$0")/kernels_run.sh" "$dest/run.sh"
du -sh "$dest"
