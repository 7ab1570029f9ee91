/* Reference for benchmarks/overhead.py: the plainest C timing of ping-pong and allreduce, with its own
 * malloc'd buffers, written apart from commcal's timing loop so the two can be compared. */
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

int ref_time(int which, MPI_Fint fcomm, int bytes, int iters, double *out)
{
    MPI_Comm comm = MPI_Comm_f2c(fcomm);
    int rank;
    MPI_Comm_rank(comm, &rank);
    char *sbuf = malloc(bytes), *rbuf = malloc(bytes);
    if (!sbuf || !rbuf) return -1;
    memset(sbuf, 1, bytes);
    memset(rbuf, 0, bytes);
    int warm = 5;                              /* untimed warm-up iterations first */
    for (int i = -warm; i < iters; i++) {
        MPI_Barrier(comm);
        double t0 = MPI_Wtime();
        if (which == 0) {                      /* ping-pong: half the round trip */
            if (rank == 0) {
                MPI_Send(sbuf, bytes, MPI_BYTE, 1, 3, comm);
                MPI_Recv(rbuf, bytes, MPI_BYTE, 1, 3, comm, MPI_STATUS_IGNORE);
            } else if (rank == 1) {
                MPI_Recv(rbuf, bytes, MPI_BYTE, 0, 3, comm, MPI_STATUS_IGNORE);
                MPI_Send(sbuf, bytes, MPI_BYTE, 0, 3, comm);
            }
            if (i >= 0) out[i] = (MPI_Wtime() - t0) / 2;
        } else {
            MPI_Allreduce(sbuf, rbuf, bytes / 4, MPI_FLOAT, MPI_SUM, comm);
            if (i >= 0) out[i] = MPI_Wtime() - t0;
        }
    }
    free(sbuf);
    free(rbuf);
    return 0;
}
