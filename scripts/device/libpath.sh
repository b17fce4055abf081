# Sourced by the device run scripts (bundle_binaries stages it next to them): unpacks lib.tgz and
# sets LD_LIBRARY_PATH so that PROBE (a staged binary, run with PROBE_ARGS) loads: the staged
# libraries, the device's CUDA 13.0 (cuBLAS, cudart), and the staged C++ runtime only when the
# device's own is too old. Returns 3 when the probe still cannot load.
stage_libpath() {
  local probe=$1 probe_args=$2
  [ -f lib.tgz ] && [ ! -d lib ] && tar xzf lib.tgz
  local cudalib
  cudalib=$(dirname "$(ls /usr/local/cuda/lib64/libcublas.so.13 2>/dev/null ||
    find / -name 'libcublas.so.13' 2>/dev/null | head -1)")
  export LD_LIBRARY_PATH=$PWD/lib:$cudalib
  "./$probe" $probe_args > /dev/null 2>&1 || export LD_LIBRARY_PATH=$PWD/lib:$cudalib:$PWD/libcxx
  "./$probe" $probe_args > /dev/null 2>&1 || { ldd "./$probe" | grep "not found"; return 3; }
}
