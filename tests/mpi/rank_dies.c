/* A rank that dies or stops calling, run under the MPI launcher by tools/test.sh:

       TB_COLLECTIVE_TIMEOUT=2 mpirun -np 3 build/mpi/rank_dies stall
       TB_COLLECTIVE_TIMEOUT=5 mpirun -np 2 build/mpi/rank_dies kill

   The last rank either sleeps (`stall`: it stays alive and never calls) or raises SIGKILL on
   itself (`kill`) before the collective; every other rank records an all_reduce and syncs it.
   Each other rank must get an error that names TB_COLLECTIVE_TIMEOUT within the timeout and a
   few seconds, and then an error at once from the next collective (the group is unusable).
   Each prints "rank_dies: rank R: timed out after S s as expected" when all of that held, waits
   the timeout's length again (so that no rank's end stops another before its own report), and
   ends with tb_shutdown, which leaves MPI_Finalize out then (the launcher ends the job, the
   sleeping rank too). Under
   `kill` the launcher may end the job before the timeout: the test script then checks only that
   mpirun ended within its bound. */
#define _POSIX_C_SOURCE 200809L
#define TB_IMPLEMENTATION
#include "torch_backend.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "stall";
    const char *limit_text = getenv("TB_COLLECTIVE_TIMEOUT");
    double limit = limit_text != NULL ? atof(limit_text) : 300.0, t0, waited;
    tb_process_group *g = tb_process_group_get("mpi");
    tb_shape shape = tb_shape_of(TB_F32, 1, 1000);
    tb_tensor *x, *y;
    tb_status st;
    int rank, size, ok = 1;
    if (g == NULL) {
        fprintf(stderr, "rank_dies: %s\n", tb_last_error());
        return 1;
    }
    rank = tb_process_group_rank(g);
    size = tb_process_group_size(g);
    if (size < 2) {
        printf("rank_dies: needs 2 or more ranks\n");
        return 1;
    }
    /* one collective that every rank completes: the group works */
    x = tb_full(&shape, 1.0, NULL);
    y = tb_all_reduce(g, x, TB_REDUCE_SUM);
    if (y == NULL || tb_sync(&y, 1) != TB_OK) {
        fprintf(stderr, "rank_dies: rank %d: the first all_reduce failed: %s\n", rank,
                tb_last_error());
        return 1;
    }
    tb_tensor_release(y);
    if (rank == size - 1) {
        if (strcmp(mode, "kill") == 0) raise(SIGKILL);
        {
            struct timespec ts = {60, 0};
            nanosleep(&ts, NULL); /* ended by the launcher long before */
        }
        return 0;
    }
    t0 = now_s();
    y = tb_all_reduce(g, x, TB_REDUCE_SUM);
    st = y == NULL ? tb_last_status() : tb_sync(&y, 1);
    waited = now_s() - t0;
    fprintf(stderr, "rank_dies: rank %d: after %.1f s: %s\n", rank, waited, tb_last_error());
    if (st != TB_ERR_EXECUTE || strstr(tb_last_error(), "TB_COLLECTIVE_TIMEOUT") == NULL) {
        fprintf(stderr, "rank_dies: rank %d: expected TB_ERR_EXECUTE naming the timeout, got %s\n",
                rank, tb_status_string(st));
        ok = 0;
    }
    if (waited < limit * 0.9 || waited > limit + 5.0) {
        fprintf(stderr, "rank_dies: rank %d: waited %.1f s, the timeout is %.1f s\n", rank, waited,
                limit);
        ok = 0;
    }
    tb_tensor_release(y);
    /* the group is unusable now: the next collective fails at once */
    t0 = now_s();
    y = tb_all_reduce(g, x, TB_REDUCE_SUM);
    st = y == NULL ? tb_last_status() : tb_sync(&y, 1);
    if (st == TB_OK || now_s() - t0 > 1.0 || strstr(tb_last_error(), "unusable") == NULL) {
        fprintf(stderr, "rank_dies: rank %d: the next collective: %s (%s)\n", rank,
                tb_status_string(st), tb_last_error());
        ok = 0;
    }
    tb_tensor_release(y);
    tb_tensor_release(x);
    if (ok) printf("rank_dies: rank %d: timed out after %.1f s as expected\n", rank, waited);
    fflush(stdout);
    /* tb_shutdown leaves MPI_Finalize out (it would wait for the missing rank); a process that
       ends without it makes the launcher end the job, so each waiting rank first gives the
       others the timeout's length to reach theirs (they started their collectives at slightly
       different times) */
    {
        struct timespec ts;
        ts.tv_sec = (time_t)limit;
        ts.tv_nsec = (long)((limit - (double)ts.tv_sec) * 1e9);
        nanosleep(&ts, NULL);
    }
    tb_shutdown();
    return ok ? 0 : 1;
}
