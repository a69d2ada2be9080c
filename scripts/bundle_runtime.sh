#!/bin/sh
# Bundles Debian 12's Open MPI and OpenBLAS runtime for a machine that has
# neither (a GPU machine with only CUDA, say; docs/cuda.md, "Where MPI and
# the BLAS come from"): fourfold built here then runs there.
#
#   scripts/bundle_runtime.sh DIR    here (Debian 12, the packages installed
#                                    by scripts/setup.sh): downloads the
#                                    installed versions' .deb files into DIR
#                                    (about 14 MB) and writes DIR/setup.sh
#   . DIR/setup.sh                   there, from the directory DIR was given
#                                    relative to: unpacks them once under
#                                    $FFDEPS_PREFIX (default /opt/ffdeps; never
#                                    into /) and sets PATH, LD_LIBRARY_PATH and
#                                    Open MPI's relocation variables
#
# Tried on an Ubuntu 24.04-based image (CUDA 13.0, no network): mpirun with 8
# ranks on one node, loopback only, as root; see the settings at the end of
# setup.sh (shared memory between ranks, TCP on lo, no UCX, no binding).
set -eu
DIR=${1:?usage: scripts/bundle_runtime.sh DIR}
mkdir -p "$DIR"
# Open MPI and OpenBLAS, and the libraries of theirs a minimal Ubuntu lacks
# (libgomp1: the library is built with OpenMP, docs/design.md §8; beside the
# pthreads OpenBLAS bundled here its passes keep threads of their own)
PKGS="openmpi-bin openmpi-common libopenmpi3 libopenblas0-pthread libgomp1 libgfortran5 libquadmath0
libatomic1 libpmix2 libmunge2 libhwloc15 libevent-core-2.1-7 libevent-pthreads-2.1-7 libucx0
libfabric1 libibverbs1 ibverbs-providers librdmacm1 libpsm-infinipath1 libpsm2-2 libnl-3-200
libnl-route-3-200 libnuma1 libudev1 libuuid1 libdnnl2 ocl-icd-libopencl1"
(
    cd "$DIR"
    for p in $PKGS; do
        v=$(dpkg-query -W -f='${Version}' "$p" 2>/dev/null) ||
            { echo "bundle_runtime: $p is not installed (scripts/setup.sh)" >&2; exit 1; }
        apt-get -o APT::Sandbox::User=root download -q "$p=$v" > /dev/null
    done
)
case $DIR in *'|'* | *'&'* | *'\'*) echo "bundle_runtime: DIR may not contain | & or \\" >&2; exit 2 ;; esac
sed "s|@DIR@|$DIR|" > "$DIR/setup.sh" <<'SETUP'
# fourfold's runtime: Debian 12's Open MPI and OpenBLAS (pthread), relocated
# under $FFDEPS_PREFIX (default /opt/ffdeps); written by
# scripts/bundle_runtime.sh. Source it: . DIR/setup.sh (FFDEPS_FORCE=1
# unpacks again). Needs dpkg (dpkg -x).
# Requires dpkg (dpkg -x), present on Debian/Ubuntu images.

FFDEPS_PREFIX=${FFDEPS_PREFIX:-/opt/ffdeps}
if [ -n "${BASH_SOURCE:-}" ]; then
    FFDEPS_DEBDIR=${FFDEPS_DEBDIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)}
else
    FFDEPS_DEBDIR=${FFDEPS_DEBDIR:-@DIR@}
fi
export FFDEPS_PREFIX FFDEPS_DEBDIR

_ff_main=$FFDEPS_PREFIX/root      # Open MPI, PMIx, OpenBLAS & co: always used
_ff_sys=$FFDEPS_PREFIX/sysroot    # generic libs: used only if the system lacks them
_ff_fb=$FFDEPS_PREFIX/fallback-lib
_ff_ma=x86_64-linux-gnu

# Packages Ubuntu may already ship (newer, ABI-compatible); the system copy wins.
_ff_sys_pkgs=" libudev1 libuuid1 libatomic1 libgomp1 libgfortran5 libquadmath0 libnuma1 libnl-3-200 libnl-route-3-200 libibverbs1 ibverbs-providers librdmacm1 "

_ff_unpack() {
    rm -rf "$_ff_main" "$_ff_sys" "$_ff_fb" || return 1
    mkdir -p "$_ff_main" "$_ff_sys" "$_ff_fb" || return 1
    for _ff_deb in "$FFDEPS_DEBDIR"/*.deb; do
        _ff_pkg=$(basename "$_ff_deb"); _ff_pkg=${_ff_pkg%%_*}
        case "$_ff_sys_pkgs" in
            *" $_ff_pkg "*) dpkg -x "$_ff_deb" "$_ff_sys" ;;
            *)              dpkg -x "$_ff_deb" "$_ff_main" ;;
        esac || { echo "ffdeps: dpkg -x $_ff_deb failed" >&2; return 1; }
    done
    rm -rf "$_ff_main/usr/share/doc" "$_ff_main/usr/share/man" "$_ff_sys/usr/share/doc" "$_ff_sys/usr/share/man"
    mkdir -p "$FFDEPS_PREFIX/hwloc-plugins"
    _ff_L=$_ff_main/usr/lib/$_ff_ma
    # Symlinks Debian's alternatives / maintainer scripts would create.
    ln -sf openblas-pthread/libblas.so.3     "$_ff_L/libblas.so.3"
    ln -sf openblas-pthread/liblapack.so.3   "$_ff_L/liblapack.so.3"
    ln -sf openblas-pthread/libopenblas.so.0 "$_ff_L/libopenblas.so.0"
    [ -e "$_ff_main/usr/lib/libpsm1/libpsm_infinipath.so.1.16" ] &&
        ln -sf ../libpsm1/libpsm_infinipath.so.1.16 "$_ff_L/libpsm_infinipath.so.1"
    for _ff_b in mpirun mpiexec; do
        ln -sf orterun "$_ff_main/usr/bin/$_ff_b"
        ln -sf orterun "$_ff_main/usr/bin/$_ff_b.openmpi"
    done
    # PMIx's config file hard-codes /usr/...; point it at the relocated tree.
    _ff_pc=$_ff_main/usr/lib/$_ff_ma/pmix2/share/pmix-mca-params.conf
    [ -f "$_ff_pc" ] && sed -i "s|= */usr/lib/|= $_ff_main/usr/lib/|" "$_ff_pc"
    # Generic libs: link only those the system does not provide.
    for _ff_f in "$_ff_sys"/lib/$_ff_ma/*.so.* "$_ff_sys"/usr/lib/$_ff_ma/*.so.*; do
        [ -e "$_ff_f" ] || continue
        _ff_so=$(basename "$_ff_f")
        case "$_ff_so" in *.so.[0-9]*.*) _ff_so=$(echo "$_ff_so" | sed 's/\(\.so\.[0-9]*\)\..*/\1/');; esac
        [ -e "$_ff_fb/$_ff_so" ] && continue
        if [ -s "/usr/lib/$_ff_ma/$_ff_so" ] || [ -s "/lib/$_ff_ma/$_ff_so" ]; then continue; fi
        ln -sf "$(dirname "$_ff_f")/$_ff_so" "$_ff_fb/$_ff_so"
    done
    ls "$FFDEPS_DEBDIR"/*.deb > "$FFDEPS_PREFIX/.stamp"
}

if [ "${FFDEPS_FORCE:-0}" = 1 ] || [ ! -f "$FFDEPS_PREFIX/.stamp" ] ||
   ! ls "$FFDEPS_DEBDIR"/*.deb | cmp -s - "$FFDEPS_PREFIX/.stamp"; then
    if ! { mkdir -p "$FFDEPS_PREFIX" && _ff_unpack; }; then
        echo "ffdeps: unpack FAILED; the environment is left as it was" >&2
        unset -f _ff_unpack
        return 1 2>/dev/null || exit 1
    fi
fi

_ff_L=$_ff_main/usr/lib/$_ff_ma
export PATH="$_ff_main/usr/bin:$PATH"
export LD_LIBRARY_PATH="$_ff_L/openmpi/lib:$_ff_L:$_ff_L/openblas-pthread:$_ff_L/pmix2/lib:$_ff_main/lib/$_ff_ma:$_ff_fb${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# Open MPI install-dir relocation (Debian layout is not prefix-relative).
export OPAL_PREFIX="$_ff_main/usr"
export OPAL_EXEC_PREFIX="$_ff_main/usr"
export OPAL_BINDIR="$_ff_main/usr/bin"
export OPAL_SBINDIR="$_ff_main/usr/sbin"
export OPAL_LIBEXECDIR="$_ff_main/usr/libexec"
export OPAL_DATAROOTDIR="$_ff_main/usr/share"
export OPAL_DATADIR="$_ff_main/usr/share"
export OPAL_PKGDATADIR="$_ff_main/usr/share/openmpi"
export OPAL_SYSCONFDIR="$_ff_main/etc/openmpi"
export OPAL_LIBDIR="$_ff_L/openmpi/lib"
export OPAL_PKGLIBDIR="$_ff_L/openmpi/lib/openmpi3"
export OPAL_INCLUDEDIR="$_ff_L/openmpi/include"
export OMPI_MCA_mca_base_component_path="$_ff_L/openmpi/lib/openmpi3"
# PMIx (external libpmix2 4.2.2, Debian prefix /usr/lib/x86_64-linux-gnu/pmix2).
export PMIX_PREFIX="$_ff_L/pmix2"
export PMIX_EXEC_PREFIX="$_ff_L/pmix2"
export PMIX_LIBDIR="$_ff_L/pmix2/lib"
export PMIX_DATADIR="$_ff_L/pmix2/share"
export PMIX_PKGDATADIR="$_ff_L/pmix2/share/pmix"
export PMIX_SYSCONFDIR="$_ff_L/pmix2/share"
export PMIX_MCA_mca_base_component_path="$_ff_L/pmix2/lib/pmix"

# Single-node, loopback-only, running as root, possibly inside a container.
export OMPI_ALLOW_RUN_AS_ROOT=1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_mpi_yield_when_idle=1
export OMPI_MCA_pml=ob1
export OMPI_MCA_btl=self,vader
export OMPI_MCA_mtl=^ofi,psm,psm2
export OMPI_MCA_osc=^ucx,pt2pt
export OMPI_MCA_btl_vader_single_copy_mechanism=none   # CMA/ptrace often blocked in containers
export OMPI_MCA_btl_base_warn_component_unused=0
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_hwloc_base_binding_policy=none
export OMPI_MCA_oob_tcp_if_include=lo
export PMIX_MCA_gds=hash
# Debian's hwloc 2.9 would dlopen plugins from the system's /usr/lib/.../hwloc; use none.
export HWLOC_PLUGINS_PATH="$FFDEPS_PREFIX/hwloc-plugins"
unset _ff_main _ff_sys _ff_fb _ff_ma _ff_sys_pkgs _ff_L _ff_deb _ff_pkg _ff_f _ff_so _ff_b _ff_pc
unset -f _ff_unpack
SETUP
echo "bundle_runtime: $(ls "$DIR"/*.deb | wc -l) packages and setup.sh in $DIR ($(du -sh "$DIR" | cut -f1))"
