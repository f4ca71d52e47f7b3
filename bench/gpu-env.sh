# Sourced (from the repository root) by bench/gpu-check.sh and bench/gpu-train.sh. GPU machines often
# lack MPI, HDF5 or Boost development files and cannot install them: bench/gpu-deps.sh fetches them as
# Debian packages into gpu-deps/debs, carried along with the tree. This unpacks them once into
# gpu-deps/root (dpkg-deb -x: nothing is installed) and offers:
#   GPU_DEPS_ROOT     the unpacked tree, or empty when no packages were brought
#   gpu_deps_use_mpi  puts the brought Open MPI, PMIx, parallel HDF5 and Boost to use, relocated
#                     (OPAL_PREFIX and PMIX_PREFIX; a copy of h5pcc with its prefix moved), and sets
#                     GPU_DEPS_CMAKE to the CMake arguments that find them; fails when there are none.
GPU_DEPS_ROOT=""
GPU_DEPS_CMAKE=()
if [ -d gpu-deps/debs/core ]; then
  GPU_DEPS_ROOT="$PWD/gpu-deps/root"
  if [ ! -e "$GPU_DEPS_ROOT/.unpacked" ]; then
    if ! command -v dpkg-deb >/dev/null; then
      echo "gpu-env: dpkg-deb not found: cannot unpack gpu-deps/debs" >&2
      GPU_DEPS_ROOT=""
    else
      rm -rf "$GPU_DEPS_ROOT" "$GPU_DEPS_ROOT.support"
      mkdir -p "$GPU_DEPS_ROOT/usr/lib/culprit-extra" "$GPU_DEPS_ROOT.support"
      for deb in gpu-deps/debs/core/*.deb; do dpkg-deb -x "$deb" "$GPU_DEPS_ROOT"; done
      for deb in gpu-deps/debs/support/*.deb; do dpkg-deb -x "$deb" "$GPU_DEPS_ROOT.support"; done
      # A linked library is taken from the packages only where the machine has none of that soname
      # (the loader's name for it: libfoo.so.N, or libfoo-X.Y.so), copied under that name.
      known=$(ldconfig -p 2>/dev/null | awk 'NR > 1 {print $1}')
      find "$GPU_DEPS_ROOT.support" \( -type f -o -type l \) | grep -E '/lib[^/]*(\.so\.[0-9]+|-[0-9.]+\.so)$' |
        while read -r lib; do
          grep -qxF "$(basename "$lib")" <<<"$known" || cp -L "$lib" "$GPU_DEPS_ROOT/usr/lib/culprit-extra/"
        done
      rm -rf "$GPU_DEPS_ROOT.support"
      touch "$GPU_DEPS_ROOT/.unpacked"
    fi
  fi
fi

gpu_deps_use_mpi() {
  [ -n "$GPU_DEPS_ROOT" ] && [ -x "$GPU_DEPS_ROOT/usr/bin/orterun" ] || return 1
  local usr="$GPU_DEPS_ROOT/usr" lib="$GPU_DEPS_ROOT/usr/lib/x86_64-linux-gnu"
  # Open MPI finds its components, help files and wrapper data under OPAL_PREFIX; PMIx (a separate
  # package, prefix .../pmix2) under PMIX_PREFIX, its plugins through its component path.
  export OPAL_PREFIX="$usr" PMIX_PREFIX="$lib/pmix2" PMIX_MCA_mca_base_component_path="$lib/pmix2/lib/pmix"
  export PATH="$usr/bin:$PATH"
  export LD_LIBRARY_PATH="$lib:$lib/openmpi/lib:$lib/hdf5/openmpi:$usr/lib/culprit-extra${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # Debian names the wrappers *.openmpi (alternatives make the plain names). h5pcc names /usr as its
  # prefix, links statically unless told (CMake's first test of it does not tell), and then needs the
  # development links of -lcurl -lcrypto -lsz ..., which a GPU machine lacks: shared it is, and
  # libhdf5.so brings its own libraries.
  export HDF5_USE_SHLIB=yes
  local w
  for w in mpicc mpicxx mpirun mpiexec; do ln -sf "$w.openmpi" "$usr/bin/$w"; done
  sed -e "s|^prefix=\"/usr\"|prefix=\"$usr\"|" -e 's|^H5BLD_LIBS=.*|H5BLD_LIBS=""|' "$usr/bin/h5pcc.openmpi" \
    > "$usr/bin/h5pcc" && chmod +x "$usr/bin/h5pcc"
  GPU_DEPS_CMAKE=(-DCMAKE_PREFIX_PATH="$usr" -DMPI_C_COMPILER="$usr/bin/mpicc" -DMPI_CXX_COMPILER="$usr/bin/mpicxx"
                  -DHDF5_C_COMPILER_EXECUTABLE="$usr/bin/h5pcc")
}
