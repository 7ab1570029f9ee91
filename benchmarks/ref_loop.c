/* Reference for benchmarks/overhead.py and ref_main.c: the plainest C timing of ping-pong and allreduce, written
 * apart from commcal's timing loop so the two can be compared. ref_time_slots with no pool uses one malloc'd
 * pair (warm); with one, it rotates call i through slot i % slots of `pool`, `stride` bytes apart, the receive
 * buffer `recv_at` bytes past the send buffer (cold buffers, as microbench/buffers.py lays them out). */
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

static void ref_call(int which, MPI_Comm comm, int rank, char *sbuf, char *rbuf, int bytes)
{
    if (which == 0) {                          /* ping-pong */
        if (rank == 0) {
            MPI_Send(sbuf, bytes, MPI_BYTE, 1, 3, comm);
            MPI_Recv(rbuf, bytes, MPI_BYTE, 1, 3, comm, MPI_STATUS_IGNORE);
        } else if (rank == 1) {
            MPI_Recv(rbuf, bytes, MPI_BYTE, 0, 3, comm, MPI_STATUS_IGNORE);
            MPI_Send(sbuf, bytes, MPI_BYTE, 0, 3, comm);
        }
    } else {
        MPI_Allreduce(sbuf, rbuf, bytes / 4, MPI_FLOAT, MPI_SUM, comm);
    }
}

int ref_time_slots(int which, MPI_Fint fcomm, int bytes, int iters, char *pool, long slots, long stride,
                   long recv_at, double *out)
{
    MPI_Comm comm = MPI_Comm_f2c(fcomm);
    int rank;
    MPI_Comm_rank(comm, &rank);
    char *own = NULL;
    if (!pool) {                               /* warm: one pair of our own */
        own = malloc(2 * (size_t)bytes + 64);
        if (!own) return -1;
        memset(own, 1, 2 * (size_t)bytes + 64);
        slots = 1, stride = 0, recv_at = bytes;
        pool = own;
    }
    int warm = 5;                              /* untimed warm-up iterations first */
    for (int i = -warm; i < iters; i++) {
        char *sbuf = pool + (long)((i + warm) % slots) * stride, *rbuf = sbuf + recv_at;
        MPI_Barrier(comm);
        double t0 = MPI_Wtime();
        ref_call(which, comm, rank, sbuf, rbuf, bytes);
        double dt = MPI_Wtime() - t0;
        if (i >= 0) out[i] = which == 0 ? dt / 2 : dt;   /* ping-pong: half the round trip */
    }
    free(own);
    return 0;
}
