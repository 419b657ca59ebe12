/* A sample MPI program: each rank says which it is and how many there are, once.
 * Built for both MPI flavours by examples/build_mpi_ranks.sh (mpicc.openmpi, mpicc.mpich);
 * run as 8 ranks by examples/mpi-ranks.yaml. */
#include <mpi.h>
#include <stdio.h>

int main(int argc, char **argv) {
    int rank, size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    printf("rank %d of %d\n", rank, size);
    MPI_Finalize();
    return 0;
}
