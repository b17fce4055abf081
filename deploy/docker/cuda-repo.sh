#!/bin/bash
# strata-cuda-repo VERSION [PACKAGE-PREFIX]: with VERSION (e.g. 13-0) adds NVIDIA's CUDA apt
# repository for Debian 12 and installs PACKAGE-PREFIX-VERSION (default: cuda-cudart-VERSION, the
# runtime library); with an empty VERSION does nothing (a cpu-only image).
set -euo pipefail
version=${1:-}
package=${2:-cuda-cudart}
[[ -z "$version" ]] && exit 0
apt-get install -y -qq --no-install-recommends curl ca-certificates
curl -fsSLo /tmp/cuda-keyring.deb \
  https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/cuda-keyring_1.1-1_all.deb
dpkg -i /tmp/cuda-keyring.deb
rm /tmp/cuda-keyring.deb
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${package}-${version}"
