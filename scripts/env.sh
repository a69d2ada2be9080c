# Sourced by the project's scripts: how fourfold runs MPI on one machine.
# Open MPI refuses root unless told; with more ranks than cores, ranks must
# yield when idle or busy-polling ranks starve each other
# (docs/design.md §11).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
if [ "${FF_RANKS:-1}" -gt "$(nproc)" ]; then
    export OMPI_MCA_mpi_yield_when_idle=1
fi
# one BLAS thread per rank unless the user says otherwise
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"
