/* The benchmark's shared declarations. The program is built by tools/bench.sh from these files:

       main.c      arguments, the order of the cases, the table, the machine
       common.c    failing loudly, rows (table and JSON), timing sides in alternation, data,
                   result checks, the backends
       impl.c      the library's implementation (TB_IMPLEMENTATION), compiled on its own
       peers.c     PyTorch eager (a server process, torch_peer.py), the memory-bandwidth bound,
                   OpenBLAS and CLBlast
       hand_cl.c   the hand-written OpenCL kernels (a floor on the OpenCL device)
       cases.c     the compute cases: chain8 add sum max row_sums softmax layer_norm matmul mlp
       conv.c      the convolution cases: conv2d_resnet, conv2d_lenet, forward and backward
       train.c     the training case: mlp_train (one AdamW step: ours, hand-written from plain
                   ops, OpenBLAS on the host, PyTorch)
       host.c      the host-overhead cases: trace replay coldstart, and the child processes
       devices.c   the in-process collective: allreduce_devices (two OpenCL devices, sharded
                   tensors, beside a hand-written copy and add) */
#ifndef BENCH_H
#define BENCH_H

#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "torch_backend.h"

/* ---- global state (common.c) ---- */

extern int g_quick;
extern FILE *g_json;
extern char g_self[4096]; /* this program, for the child processes */
extern tb_device g_cpu;

/* The two compiled backends: [0] opencl:0, [1] native:0. One that cannot run has ok == 0 and
   says why; its rows are left out. */
typedef struct bench_backend {
    const char *name;
    int ok;
    int opencl;
    tb_device dev;
    char why[512];
} bench_backend;

#define NUM_BACKENDS 2
extern bench_backend g_backends[NUM_BACKENDS];
extern int g_threads; /* the cores the native backend uses: every peer runs on as many */

/* The OpenCL objects of opencl:0 (the library's own context and queue); valid while
   g_backends[0].ok. */
extern cl_platform_id g_platform;
extern cl_device_id g_device;
extern cl_context g_context;
extern cl_command_queue g_queue;

void open_backends(int want_opencl, int want_native);
bench_backend *backend_named(const char *name);

/* ---- failing loudly ---- */

void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
tb_tensor *need(tb_tensor *t, const char *what);
void need_ok(tb_status st, const char *what);
void cl_need(cl_int err, const char *what);
void note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *notes_text(void);

/* ---- rows ----
   One row per (case, backend): our time beside PyTorch's, the bound and an anchor. Times in
   seconds, NAN where there is none. */
typedef struct row {
    char name[40];
    char backend[16];
    double ours;
    double torch;
    double bound;         /* bandwidth: least traffic / measured bandwidth; matmul, mlp: OpenBLAS */
    char bound_kind[16];  /* "bandwidth", "openblas", "" */
    char anchor_name[24]; /* a hand-written kernel, CLBlast, a target, ... */
    double anchor;
    char unit[16];
    double value; /* our rate in unit */
    double bytes; /* least traffic */
    double flops;
    int writes; /* bandwidth rows: whether the output is large (which bandwidth bounds it) */
    int reps;
} row;

row row_new(const char *name, const char *backend);
void add_row(const row *r);
/* While rows are held, add_row keeps them; release_rows sets the bandwidth rows' bound from the
   final bandwidth (measure_bandwidth, bandwidth_end), then prints and writes them. */
void hold_rows(void);
void release_rows(void);
void print_header(void);
void print_table(void);
void json_machine(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- timing ----
   A side is one way of doing the work of a case (our backends, PyTorch, an anchor). measure()
   calls each twice untimed (warm-up), once timed to size the repetitions, then the repetitions,
   one call of every side per round, in an order shuffled anew every round; each side gets the
   median of its rounds. A flushed side finds the caches full of other data at each timed call
   (flush_caches). A primed side gets an untimed call right before each timed one (while
   its calls take under half a second), so that it runs at the speed of a loop of calls; a side
   whose library keeps threads spinning after a call (OpenBLAS, PyTorch's BLAS) sleeps for a
   cooldown after each call, so that the next side finds the cores idle. */
typedef void (*run_fn)(void *ctx);

typedef struct side {
    const char *name;
    run_fn run;                 /* timed here, */
    double (*timed)(void *ctx); /* or returns its own time (PyTorch times itself) */
    void *ctx;
    int prime;          /* an untimed call right before each timed one */
    int flush;          /* the caches flushed (untimed) right before each timed call */
    double cooldown;    /* seconds to sleep after each call: BLAS threads that spin
                           after a call would take the cores from the next side */
    double t;           /* the median */
    double samples[64]; /* one per round */
    double faults[64];  /* minor page faults of each round's timed call */
    double faults_med;
} side;

double now_s(void);
double median(double *v, int n);
double time_once(run_fn fn, void *ctx);
/* force_reps > 0 fixes the number of rounds (at most 64). Returns the rounds run. */
int measure(side *sides, int n, int force_reps);
/* A note with each side's page faults per timed call, when any side has some. */
void note_faults(const char *name, const side *sides, int n);

/* ---- data and checks ---- */

void seed_rng(uint64_t seed);
float *host_alloc(size_t n);
float *host_random(size_t n, float scale);
tb_tensor *upload(const float *h, int32_t rank, const int64_t *dims, const tb_device *dev);
size_t numel_of(tb_tensor *t);
float *to_host(tb_tensor *t);
/* Waits for t on its backend (tb_sync, and clFinish on OpenCL). */
void sync_on(tb_tensor *t, const bench_backend *be);
/* max |got - want| <= atol + rtol * |want| everywhere, or the run stops. */
void check_close(const char *what, const float *got, const float *want, size_t n, double atol,
                 double rtol);
/* The sum of a backend's "NAME: value" lines in tb_backend_metrics_report (0 if none). */
double backend_counter(const char *backend, const char *name);

/* ---- OpenCL helpers (common.c) ---- */

void finish(void);
cl_mem tensor_mem(tb_tensor *t);
cl_mem cl_buffer(size_t bytes);
float *cl_read(cl_mem m, size_t n);

/* ---- peers (peers.c) ---- */

/* PyTorch eager in a process of its own (/usr/bin/python3 tools/bench/torch_peer.py). */
void torch_start(const char *script);
void torch_stop(void);
int torch_ok(void);
const char *torch_about(void); /* version and threads, or why it is skipped */

typedef struct torch_input {
    const char *name;
    const float *data;
    int rank;
    int64_t dims[2];
} torch_input;

/* Loads a case into the PyTorch process and runs it once; returns its result (out_n floats,
   malloc'd) or NULL when PyTorch cannot run it (a note says why). */
float *torch_setup(const char *kase, const torch_input *in, int n_in, size_t out_n);
double torch_timed(void *unused); /* a side's `timed`: one call, timed by PyTorch's process */
double torch_last_faults(void);   /* the minor page faults of that call in PyTorch's process */

/* The memory-bandwidth bound: read, copy and triad over buffers much larger than the caches, on
   g_threads threads, best of several runs (and the same over 64 MiB buffers, for a note). */
typedef struct bandwidth {
    double read, copy, triad; /* bytes per second, STREAM's counting (no write-allocate) */
    double copy_stream;       /* copy with non-temporal stores (x86; else a plain copy) */
    double buffer_bytes;
    double l3_bytes; /* what the CPU reports, 0 if unknown */
    int runs;
    int measured; /* 1 after measure_bandwidth, 2 after bandwidth_end */
    int wide;     /* the read and the copy with non-temporal stores in 64-byte vectors (AVX-512) */
    /* the same loops over 64 MiB buffers */
    double small_bytes, small_read, small_copy, small_copy_stream, small_triad;
} bandwidth;
extern bandwidth g_bw;
void measure_bandwidth(void);
/* Measures again (after the bandwidth cases), keeps the better of the two for each loop (the
   machine's load moves), notes both and frees the buffers. */
void bandwidth_end(void);
/* Reads a bandwidth buffer (twice the last-level cache, at least 256 MiB; 64 MiB with
   --quick) on g_threads threads, so that what a case touched before is out of the caches.
   Returns the seconds it took. */
double flush_caches(void);
/* The least time to move `bytes` (read only, or with writes). */
double bound_time(double bytes, int writes);
/* The bound as a side of the case's own rounds (flushed and timed as the others, so it sees
   the memory the case saw: these machines' bandwidth moves by 1.5x from minute to minute):
   the same bytes read (read-only cases) or copied with non-temporal stores (half read, half
   written) over the bandwidth buffers. 0 with --quick (buffers the caches may partly hold,
   cases of a few MiB) or when the buffers are too small for the bytes. */
int bound_side(side *s, double bytes, int writes);
/* A note comparing the bandwidth over 64 MiB buffers with the bound's. */
void note_footprints(void);

/* OpenBLAS (host) and CLBlast (OpenCL device), when built in. */
int have_openblas(void);
int have_clblast(void);
void openblas_setup(void);
const char *openblas_about(void);
void openblas_sgemm(int m, int n, int k, const float *a, const float *b, float beta, float *c);
/* c = op(a) op(b) + beta c, row-major; op(a) is m x k (a stored k x m when trans_a), op(b)
   k x n (b stored n x k when trans_b). */
void openblas_gemm(int trans_a, int trans_b, int m, int n, int k, const float *a, const float *b,
                   float beta, float *c);
void clblast_sgemm(int n, cl_mem a, cl_mem b, cl_mem c); /* square, row-major; ends with clFinish */

/* ---- hand-written OpenCL kernels (hand_cl.c) ----
   Each is tuned once (launch shape and design) and checked by its caller. */
typedef struct hand hand;
void hand_build(void);
void hand_release_all(void);
hand *hand_elementwise(int add, cl_mem x, cl_mem y, int64_t n); /* chain8 (y unused) or x + y */
hand *hand_reduce(int max, cl_mem x, int64_t n, int64_t rows);  /* rows > 0: row reductions */
hand *hand_norm(int layer_norm, cl_mem x, cl_mem w, cl_mem b, int64_t rows, int64_t cols,
                float eps);
cl_kernel hand_kernel(const char *name);
void hand_run(void *h);                 /* a side's run: enqueue, clFinish */
float *hand_result(hand *h, size_t *n); /* reads the output */
cl_mem hand_out(hand *h);               /* the output buffer */
const char *hand_label(const hand *h);  /* "hand_kernel", "hand_2stage" */
const char *hand_about(const hand *h);  /* the design and shape the tuning picked */
void hand_free(hand *h);

/* ---- cases ---- */

void case_chain8(int64_t n);
void case_add(int64_t n);
void case_gates(int64_t n);
void case_reduce(const char *name, int max, int64_t n, int64_t rows);
void case_norm(const char *name, int layer_norm, int64_t rows, int64_t cols);
void case_matmul(int n);
void case_half(const char *kase, int64_t n); /* chain8, axpy, sum or matmul, f16 and bf16 */
void case_mlp(int64_t batch);
void case_mlp_train(int64_t batch);
void case_conv(const char *label, int64_t n, int64_t c, int64_t o, int64_t hw, int64_t k,
               int64_t pad, int backward);
void case_trace(void);
void case_replay(void);
void case_coldstart(void);
void case_allreduce_devices(int64_t n); /* devices.c: two OpenCL devices of this process */
int child_main(const char *mode, const char *backend);

/* The MLP, shared by cases.c and host.c. */
#define MLP_LAYERS 3
extern const int64_t g_mlp_sizes[MLP_LAYERS + 1];
typedef struct mlp {
    int64_t batch;
    float *hx, *hw[MLP_LAYERS], *hb[MLP_LAYERS];
    tb_tensor *x, *w[MLP_LAYERS], *b[MLP_LAYERS];
    const bench_backend *be;
    double t_record, t_sync, t_finish; /* the host split of the last step */
} mlp;
void mlp_init_host(mlp *m, int64_t batch);
void mlp_upload(mlp *m, const bench_backend *be);
void mlp_release(mlp *m);
void mlp_free_host(mlp *m);
tb_tensor *mlp_forward(const mlp *m);
float *mlp_reference(mlp *m);

/* Runs this program as `--child MODE BACKEND` with `env` (NAME=value words) added; its stdout
   goes to `out`. Returns its exit status (-1 when it could not start). */
int run_child(const char *mode, const char *backend, const char *env, char *out, size_t cap);
void make_temp_dir(char *out, size_t cap, const char *tag);
void remove_tree(const char *dir);

#endif
