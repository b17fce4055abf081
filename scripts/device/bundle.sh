# Sourced by the *_stage.sh scripts. bundle_binaries DEST BINARY...: copies the binaries into DEST
# (stripped) and their non-system shared libraries into DEST/lib.txz (lib/ and, used only when the
# device's own C++ runtime is too old, libcxx/). CUDA's own libraries stay out (cuBLAS alone is
# over the device tool's 64 MiB; the device has the same CUDA 13.0): the run scripts add its path.
bundle_binaries() {
  local dest=$1
  shift
  mkdir -p "$dest/lib" "$dest/libcxx"
  cp "$@" "$dest/"
  local bins=()
  for b in "$@"; do bins+=("$dest/$(basename "$b")"); done
  strip "${bins[@]}"
  for lib in $(ldd "${bins[@]}" | awk '/=>/ {print $3}' | sort -u); do
    case $(basename "$lib") in
      libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*) ;;
      libcublas*|libcudart*|libcuda.so*) ;;
      libstdc++.so*|libgcc_s.so*) cp -L "$lib" "$dest/libcxx/" ;;
      *) cp -L "$lib" "$dest/lib/" ;;
    esac
  done
  # xz: 23.5 MB against gzip's 38.6 MB for strata's libraries (ICU data and OpenBLAS lead), room
  # for more binaries under the device tool's 64 MiB; ~30 s here on two cores.
  tar cf - -C "$dest" lib libcxx | xz -6 -T2 > "$dest/lib.txz" && rm -rf "$dest/lib" "$dest/libcxx"
  cp "$(dirname "${BASH_SOURCE[0]}")"/{libpath,clocks}.sh "$dest/"
}
