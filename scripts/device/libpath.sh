# Sourced by the device run scripts (bundle_binaries stages it next to them): unpacks lib.txz and
# sets LD_LIBRARY_PATH so that PROBE (a staged binary, run with PROBE_ARGS) loads: the staged
# libraries, the device's CUDA 13.0 (cuBLAS, cudart), and the staged C++ runtime only when the
# device's own is too old. Returns 3 when the probe still cannot load.
stage_libpath() {
  local probe=$1 probe_args=$2
  # tar's xz filter where the device has it, else Python's (the device has python3 for torch).
  if [ -f lib.txz ] && [ ! -d lib ]; then
    tar xJf lib.txz 2>/dev/null ||
      python3 -c "import tarfile; tarfile.open('lib.txz', 'r:xz').extractall()" || return 3
  fi
  [ -f lib.tgz ] && [ ! -d lib ] && tar xzf lib.tgz
  local cudalib
  cudalib=$(dirname "$(ls /usr/local/cuda/lib64/libcublas.so.13 2>/dev/null ||
    find / -name 'libcublas.so.13' 2>/dev/null | head -1)")
  export LD_LIBRARY_PATH=$PWD/lib:$cudalib
  "./$probe" $probe_args > /dev/null 2>&1 || export LD_LIBRARY_PATH=$PWD/lib:$cudalib:$PWD/libcxx
  "./$probe" $probe_args > /dev/null 2>&1 || { ldd "./$probe" | grep "not found"; return 3; }
}
