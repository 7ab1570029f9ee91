/* commcal's low-overhead timing loop: times `iters` calls of one operation, each between a
 * barrier (outside the timed region) and MPI_Wtime, into out[]. Handles arrive as Fortran
 * integers (mpi4py's py2f) so one source serves Open MPI and MPICH. Op codes: microbench/ops.py.
 * Call i uses the buffers of slot (first + i) % slots, `stride` bytes past sbuf and rbuf per slot
 * (microbench/buffers.py: cold buffers). With gap > 0 each call's barrier follows `gap` seconds idle
 * (sweep --gap-ms: collectives spaced as between compute steps). The barrier is on fbar: the call's
 * own communicator, or one spanning every group that starts a call at once (sweep --after-gemm). */
#include <mpi.h>
#include <time.h>

int commcal_time(int op, MPI_Fint fcomm, char *sbuf0, char *rbuf0, int count, int block,
                 MPI_Fint fdtype, MPI_Fint fsum, int iters, long first, long slots, long stride,
                 double gap, MPI_Fint fbar, double *out)
{
    MPI_Comm comm = MPI_Comm_f2c(fcomm), bar = MPI_Comm_f2c(fbar);
    MPI_Datatype dt = MPI_Type_f2c(fdtype);
    MPI_Op sum = MPI_Op_f2c(fsum);
    int rank, rc = MPI_SUCCESS;
    MPI_Comm_rank(comm, &rank);
    struct timespec pause = {(time_t)gap, (long)((gap - (double)(time_t)gap) * 1e9)};
    for (int i = 0; i < iters && rc == MPI_SUCCESS; i++) {
        long offset = ((first + i) % slots) * stride;
        char *sbuf = sbuf0 + offset, *rbuf = rbuf0 + offset;
        if (gap > 0)
            nanosleep(&pause, NULL);
        MPI_Barrier(bar);
        double t0 = MPI_Wtime();
        switch (op) {
        case 0: rc = MPI_Allreduce(sbuf, rbuf, count, dt, sum, comm); break;
        case 1: rc = MPI_Allgather(sbuf, block, dt, rbuf, block, dt, comm); break;
        case 2: rc = MPI_Reduce_scatter_block(sbuf, rbuf, block, dt, sum, comm); break;
        case 3: rc = MPI_Alltoall(sbuf, block, dt, rbuf, block, dt, comm); break;
        case 4: rc = MPI_Bcast(sbuf, count, dt, 0, comm); break;
        case 5: rc = MPI_Reduce(sbuf, rbuf, count, dt, sum, 0, comm); break;
        case 6:
            if (rank == 0) {
                rc = MPI_Send(sbuf, count, dt, 1, 7, comm);
                if (rc == MPI_SUCCESS) rc = MPI_Recv(rbuf, count, dt, 1, 7, comm, MPI_STATUS_IGNORE);
            } else {
                rc = MPI_Recv(rbuf, count, dt, 0, 7, comm, MPI_STATUS_IGNORE);
                if (rc == MPI_SUCCESS) rc = MPI_Send(sbuf, count, dt, 0, 7, comm);
            }
            break;
        case 7:
            rc = MPI_Sendrecv(sbuf, count, dt, 1 - rank, 9, rbuf, count, dt, 1 - rank, 9, comm,
                              MPI_STATUS_IGNORE);
            break;
        default: return -1;
        }
        out[i] = MPI_Wtime() - t0;
    }
    return rc;
}
