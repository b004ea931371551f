/* The all-reduce row of the benchmark: tb_all_reduce (sum) of 16M floats between the ranks of
   the `mpi` process group beside raw MPI_Allreduce of the same values, in the same run, on the
   same ranks. Built with mpicc and run under mpirun by tools/bench.sh:

       mpirun -np 2 build/bench/mpi_allreduce [--quick] [--json FILE] [--devices D,...]

   Each device (default cpu:0, native:0, opencl:0; one that cannot run here is skipped with a
   note) gets one row: our median time, MPI's, and MPI / ours (target >= 0.9 on host memory).
   Every timed call starts after a barrier; a call's time is the slowest rank's. Both sides are
   checked against the serial sum first. --json appends one object per row to FILE. */
#define TB_IMPLEMENTATION
#include "torch_backend.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int rank_, size_;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The slowest rank's time of one call. */
static double slowest(double t) {
    double m = t;
    MPI_Allreduce(&t, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return m;
}

static double time_ours(tb_process_group *g, tb_tensor *x) {
    double t0, t;
    tb_tensor *y;
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = now_s();
    y = tb_all_reduce(g, x, TB_REDUCE_SUM);
    if (y == NULL || tb_sync(&y, 1) != TB_OK) {
        fprintf(stderr, "bench_mpi: rank %d: %s\n", rank_, tb_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    t = now_s() - t0;
    tb_tensor_release(y);
    return slowest(t);
}

static double time_mpi(const float *a, float *b, int n) {
    double t0;
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = now_s();
    MPI_Allreduce(a, b, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    return slowest(now_s() - t0);
}

/* Whether out holds the serial sum over the ranks of element i's values. */
static int check(const float *out, int n, const char *who) {
    int i, bad = 0;
    for (i = 0; i < n; i++) {
        float want = 0;
        int r;
        for (r = 0; r < size_; r++)
            want += (float)((i % 13) + r) * 0.25f;
        bad += out[i] != want;
    }
    if (bad != 0) fprintf(stderr, "bench_mpi: rank %d: %s: %d wrong values\n", rank_, who, bad);
    return bad == 0;
}

static int run_device(tb_process_group *g, const char *device, const float *a, float *b, int n,
                      int reps, const char *json) {
    tb_device dev;
    tb_shape s = tb_shape_of(TB_F32, 1, n);
    tb_tensor *x, *y;
    double *ours = (double *)malloc((size_t)reps * sizeof(double));
    double *mpi = (double *)malloc((size_t)reps * sizeof(double));
    int ok = 1, k, have = tb_device_parse(device, &dev) == TB_OK;
    /* a device must be usable on every rank */
    x = have ? tb_tensor_from_host(a, &s, &dev) : NULL;
    have = x != NULL && tb_sync(&x, 1) == TB_OK;
    MPI_Allreduce(MPI_IN_PLACE, &have, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!have) {
        if (rank_ == 0) printf("allreduce_mpi  %-9s skipped: %s\n", device, tb_last_error());
        tb_tensor_release(x);
        tb_clear_error();
        free(ours);
        free(mpi);
        return 1;
    }
    y = tb_all_reduce(g, x, TB_REDUCE_SUM);
    memset(b, 0, (size_t)n * sizeof(float));
    ok = y != NULL && tb_tensor_to_host(y, b, (size_t)n * sizeof(float)) == TB_OK &&
         check(b, n, "tb_all_reduce");
    tb_tensor_release(y);
    MPI_Allreduce(a, b, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    ok = ok && check(b, n, "MPI_Allreduce");
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!ok) MPI_Abort(MPI_COMM_WORLD, 1);
    for (k = 0; k < 2; k++) { /* warm-up: buffers touched, pools filled */
        time_ours(g, x);
        time_mpi(a, b, n);
    }
    for (k = 0; k < reps; k++) { /* rounds in alternating order */
        if (k % 2 == 0) {
            ours[k] = time_ours(g, x);
            mpi[k] = time_mpi(a, b, n);
        } else {
            mpi[k] = time_mpi(a, b, n);
            ours[k] = time_ours(g, x);
        }
    }
    qsort(ours, (size_t)reps, sizeof(double), cmp_double);
    qsort(mpi, (size_t)reps, sizeof(double), cmp_double);
    if (rank_ == 0) {
        double o = ours[reps / 2], m = mpi[reps / 2];
        printf("allreduce_mpi  %-9s %d f32 x %d ranks  ours %8.2f ms  MPI_Allreduce %8.2f ms  "
               "MPI/ours %.2f  (%d reps, medians)\n",
               device, n, size_, o * 1e3, m * 1e3, m / o, reps);
        if (json != NULL) {
            FILE *f = fopen(json, "a");
            if (f != NULL) {
                fprintf(f,
                        "{\"case\": \"allreduce_mpi\", \"backend\": \"%s\", \"ours\": %.9f, "
                        "\"anchor_name\": \"MPI_Allreduce\", \"anchor\": %.9f, "
                        "\"ratio_anchor\": %.4f, \"ranks\": %d, \"numel\": %d, \"reps\": %d}\n",
                        device, o, m, m / o, size_, n, reps);
                fclose(f);
            }
        }
    }
    tb_tensor_release(x);
    free(ours);
    free(mpi);
    return 1;
}

int main(int argc, char **argv) {
    const char *json = NULL, *devices = "cpu:0,native:0,opencl:0";
    char list[256], *dev, *save = NULL;
    int quick = 0, i, n, reps;
    float *a, *b;
    tb_process_group *g;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    for (i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0)
            quick = 1;
        else if (strcmp(argv[i], "--json") == 0 && i + 1 < argc)
            json = argv[++i];
        else if (strcmp(argv[i], "--devices") == 0 && i + 1 < argc)
            devices = argv[++i];
    }
    n = quick ? 1 << 20 : 16 << 20;
    reps = quick ? 5 : 15;
    g = tb_process_group_get("mpi");
    if (g == NULL) {
        fprintf(stderr, "bench_mpi: %s\n", tb_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    a = (float *)malloc((size_t)n * sizeof(float));
    b = (float *)malloc((size_t)n * sizeof(float));
    for (i = 0; i < n; i++)
        a[i] = (float)((i % 13) + rank_) * 0.25f;
    snprintf(list, sizeof list, "%s", devices);
    for (dev = strtok_r(list, ",", &save); dev != NULL; dev = strtok_r(NULL, ",", &save)) {
        run_device(g, dev, a, b, n, reps, json);
    }
    free(a);
    free(b);
    tb_shutdown(); /* MPI_Init was the program's: the library leaves MPI running */
    MPI_Finalize();
    return 0;
}
