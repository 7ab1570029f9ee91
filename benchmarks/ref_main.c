/* Standalone reference for benchmarks/peers.py: ref_loop.c's timing (each call after a barrier, its own malloc'd
 * buffers) in a C program of its own, MPI at MPI_THREAD_SINGLE and no Python in the process, combined as commcal's
 * default method combines (max over ranks per call, then the median). Usage: ref_main SIZE... ; prints one line
 * "pingpong|allreduce SIZE MEDIAN_US" per operation and size. */
#include "ref_loop.c"
#include <stdio.h>

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    int provided, rank;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SINGLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    for (int which = 0; which < 2; which++) {
        for (int a = 1; a < argc; a++) {
            int bytes = atoi(argv[a]);
            long want = 20000000L / (bytes > 8 ? bytes : 8);
            int iters = want < 100 ? 100 : want > 20000 ? 20000 : (int)want;
            double *out = malloc(sizeof(double) * iters);
            if (!out || ref_time(which, MPI_Comm_c2f(MPI_COMM_WORLD), bytes, iters, out) != 0)
                MPI_Abort(MPI_COMM_WORLD, 1);
            MPI_Allreduce(MPI_IN_PLACE, out, iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            qsort(out, iters, sizeof(double), by_value);
            double median = (out[(iters - 1) / 2] + out[iters / 2]) / 2;
            if (rank == 0)
                printf("%s %d %.4f\n", which == 0 ? "pingpong" : "allreduce", bytes, median * 1e6);
            free(out);
        }
    }
    MPI_Finalize();
    return 0;
}
