/* Standalone reference for benchmarks/peers.py: ref_loop.c's timing (each call after a barrier) in a C program of
 * its own, MPI at MPI_THREAD_SINGLE and no Python in the process, combined as commcal's default method combines
 * (max over ranks per call, then the median). Each size is timed twice: on one warm malloc'd pair, and cold, the
 * calls rotating through copies of the pair that fill a 64 MiB pool laid out as microbench/buffers.py lays the
 * default method's (send at 0, receive at the next 64 B, slots a whole number of 4 KiB pages apart; the pair
 * alone where two copies do not fit). Usage: ref_main SIZE... ; prints "pingpong|allreduce warm|cold SIZE
 * MEDIAN_US" per operation, buffer mode and size. */
#include "ref_loop.c"
#include <stdio.h>

#define POOL_BYTES (64L << 20)

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static long round_up(long n, long to) { return (n + to - 1) / to * to; }

int main(int argc, char **argv)
{
    int provided, rank;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SINGLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    char *pool = NULL;                 /* allocated after the warm runs, which never touch it */
    for (int cold = 0; cold < 2; cold++) {
        if (cold && !(pool = aligned_alloc(4096, POOL_BYTES)))
            MPI_Abort(MPI_COMM_WORLD, 1);
        if (cold)
            memset(pool, 1, POOL_BYTES);
        for (int which = 0; which < 2; which++) {
            for (int a = 1; a < argc; a++) {
                int bytes = atoi(argv[a]);
                long want = 20000000L / (bytes > 8 ? bytes : 8);
                int iters = want < 100 ? 100 : want > 20000 ? 20000 : (int)want;
                long stride = round_up(round_up(bytes, 64) + bytes, 4096);
                long slots = cold && POOL_BYTES / stride >= 2 ? POOL_BYTES / stride : 0;
                double *out = malloc(sizeof(double) * iters);
                if (!out || ref_time_slots(which, MPI_Comm_c2f(MPI_COMM_WORLD), bytes, iters, slots ? pool : NULL,
                                     slots, stride, round_up(bytes, 64), out) != 0)
                    MPI_Abort(MPI_COMM_WORLD, 1);
                MPI_Allreduce(MPI_IN_PLACE, out, iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
                qsort(out, iters, sizeof(double), by_value);
                double median = (out[(iters - 1) / 2] + out[iters / 2]) / 2;
                if (rank == 0)
                    printf("%s %s %d %.4f\n", which == 0 ? "pingpong" : "allreduce", cold ? "cold" : "warm", bytes,
                           median * 1e6);
                free(out);
            }
        }
    }
    free(pool);
    MPI_Finalize();
    return 0;
}
