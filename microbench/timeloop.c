/* commcal's low-overhead timing loop: times `iters` calls of one operation, each between a
 * barrier (outside the timed region) and MPI_Wtime, into out[]. Handles arrive as Fortran
 * integers (mpi4py's py2f) so one source serves Open MPI and MPICH. Op codes: microbench/ops.py.
 * Call i uses the buffers of slot (first + i) % slots, `stride` bytes past sbuf and rbuf per slot
 * (microbench/buffers.py: cold buffers). With gap > 0 each call's barrier follows `gap` seconds idle
 * (sweep --gap-ms: collectives spaced as between compute steps). The barrier is on fbar: the call's
 * own communicator, or one spanning every group that starts a call at once (sweep --after-gemm). */
#include <mpi.h>
#include <stdlib.h>
#include <time.h>

#define WINDOW 64   /* osu_bw's messages in flight (microbench/methods.py) */

/* One call of operation `op`. Codes 0-7: microbench/ops.py; 8: MPI_Reduce_scatter with equal counts (as OSU and
 * IMB call it); 9: osu_bw's window, WINDOW messages from rank 0 then a 1-byte acknowledgement. */
static inline int call(int op, MPI_Comm comm, int rank, char *sbuf, char *rbuf, int count, int block,
                       MPI_Datatype dt, MPI_Op sum, int *counts, MPI_Request *reqs)
{
    int rc = MPI_SUCCESS;
    switch (op) {
    case 0: return MPI_Allreduce(sbuf, rbuf, count, dt, sum, comm);
    case 1: return MPI_Allgather(sbuf, block, dt, rbuf, block, dt, comm);
    case 2: return MPI_Reduce_scatter_block(sbuf, rbuf, block, dt, sum, comm);
    case 3: return MPI_Alltoall(sbuf, block, dt, rbuf, block, dt, comm);
    case 4: return MPI_Bcast(sbuf, count, dt, 0, comm);
    case 5: return MPI_Reduce(sbuf, rbuf, count, dt, sum, 0, comm);
    case 6:
        if (rank == 0) {
            rc = MPI_Send(sbuf, count, dt, 1, 7, comm);
            if (rc == MPI_SUCCESS) rc = MPI_Recv(rbuf, count, dt, 1, 7, comm, MPI_STATUS_IGNORE);
        } else {
            rc = MPI_Recv(rbuf, count, dt, 0, 7, comm, MPI_STATUS_IGNORE);
            if (rc == MPI_SUCCESS) rc = MPI_Send(sbuf, count, dt, 0, 7, comm);
        }
        return rc;
    case 7:
        return MPI_Sendrecv(sbuf, count, dt, 1 - rank, 9, rbuf, count, dt, 1 - rank, 9, comm, MPI_STATUS_IGNORE);
    case 8: return MPI_Reduce_scatter(sbuf, rbuf, counts, dt, sum, comm);
    case 9:
        for (int j = 0; j < WINDOW && rc == MPI_SUCCESS; j++)
            rc = rank == 0 ? MPI_Isend(sbuf, count, dt, 1, 100, comm, reqs + j)
                           : MPI_Irecv(rbuf, count, dt, 0, 100, comm, reqs + j);
        if (rc == MPI_SUCCESS) rc = MPI_Waitall(WINDOW, reqs, MPI_STATUSES_IGNORE);
        if (rc == MPI_SUCCESS)
            rc = rank == 0 ? MPI_Recv(rbuf, 1, MPI_CHAR, 1, 101, comm, MPI_STATUS_IGNORE)
                           : MPI_Send(sbuf, 1, MPI_CHAR, 0, 101, comm);
        return rc;
    default: return -1;
    }
}

int commcal_time(int op, MPI_Fint fcomm, char *sbuf0, char *rbuf0, int count, int block,
                 MPI_Fint fdtype, MPI_Fint fsum, int iters, long first, long slots, long stride,
                 double gap, MPI_Fint fbar, double *out)
{
    MPI_Comm comm = MPI_Comm_f2c(fcomm), bar = MPI_Comm_f2c(fbar);
    MPI_Datatype dt = MPI_Type_f2c(fdtype);
    MPI_Op sum = MPI_Op_f2c(fsum);
    int rank, rc = MPI_SUCCESS;
    MPI_Comm_rank(comm, &rank);
    if (op > 7) return -1;
    struct timespec pause = {(time_t)gap, (long)((gap - (double)(time_t)gap) * 1e9)};
    for (int i = 0; i < iters && rc == MPI_SUCCESS; i++) {
        long offset = ((first + i) % slots) * stride;
        char *sbuf = sbuf0 + offset, *rbuf = rbuf0 + offset;
        if (gap > 0)
            nanosleep(&pause, NULL);
        MPI_Barrier(bar);
        double t0 = MPI_Wtime();
        rc = call(op, comm, rank, sbuf, rbuf, count, block, dt, sum, NULL, NULL);
        out[i] = MPI_Wtime() - t0;
    }
    return rc;
}

/* A peer's loop (microbench/methods.py), warm buffers: `iters` calls of `op` and this rank's timed seconds in
 * *out. style 0: each call timed, back to back (osu_latency), the sum; 1: each call timed, then a barrier
 * outside the timed region (OSU collectives), the sum; 2: one barrier, then the whole loop timed (IMB,
 * nccl-tests, osu_bw). */
int commcal_peer(int op, MPI_Fint fcomm, char *sbuf, char *rbuf, int count, int block, MPI_Fint fdtype,
                 MPI_Fint fsum, int iters, int style, double *out)
{
    MPI_Comm comm = MPI_Comm_f2c(fcomm);
    MPI_Datatype dt = MPI_Type_f2c(fdtype);
    MPI_Op sum = MPI_Op_f2c(fsum);
    int rank, size, rc = MPI_SUCCESS;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    int *counts = malloc(sizeof(int) * size);
    MPI_Request reqs[WINDOW];
    if (!counts) return -1;
    for (int r = 0; r < size; r++) counts[r] = block;
    double total = 0.0;
    if (style == 2) {
        MPI_Barrier(comm);
        double t0 = MPI_Wtime();
        for (int i = 0; i < iters && rc == MPI_SUCCESS; i++)
            rc = call(op, comm, rank, sbuf, rbuf, count, block, dt, sum, counts, reqs);
        total = MPI_Wtime() - t0;
    } else {
        for (int i = 0; i < iters && rc == MPI_SUCCESS; i++) {
            double t0 = MPI_Wtime();
            rc = call(op, comm, rank, sbuf, rbuf, count, block, dt, sum, counts, reqs);
            total += MPI_Wtime() - t0;
            if (style == 1 && rc == MPI_SUCCESS) rc = MPI_Barrier(comm);
        }
    }
    free(counts);
    *out = total;
    return rc;
}
