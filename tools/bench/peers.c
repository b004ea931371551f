/* What our numbers are measured against, in the same run and on the same threads: PyTorch eager
   (a server process running tools/bench/torch_peer.py), the memory-bandwidth bound (read, copy
   and triad loops over buffers much larger than the caches), OpenBLAS and CLBlast. */
#define _GNU_SOURCE
#include "bench.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#if defined(__SSE__)
#include <immintrin.h>
#endif
#include <unistd.h>

#ifdef BENCH_CLBLAST
#include <clblast_c.h>
#endif
#ifdef BENCH_OPENBLAS
#include <cblas.h>
/* OpenBLAS's own functions, declared here in case cblas.h is another implementation's */
int openblas_get_num_threads(void);
void openblas_set_num_threads(int num_threads);
char *openblas_get_config(void);
#endif

extern char **environ;

/* ======================================================================================
   PyTorch eager
   ====================================================================================== */

#define TORCH_PYTHON "/usr/bin/python3"

static pid_t g_torch_pid = -1;
static FILE *g_torch_to, *g_torch_from;
static int g_torch_ok;
static char g_torch_about[512] = "not started";
static char g_torch_dir[1024];
static double g_torch_faults;

int torch_ok(void) {
    return g_torch_ok;
}

const char *torch_about(void) {
    return g_torch_about;
}

static void torch_lost(const char *when) {
    if (!g_torch_ok) return;
    g_torch_ok = 0;
    snprintf(g_torch_about, sizeof g_torch_about, "skipped: the PyTorch process ended (%s)", when);
    note("PyTorch: its process ended during %s; the cases after it have no PyTorch time", when);
}

/* One answer line from the PyTorch process, without its newline; NULL when it ended. */
static char *torch_line(char *buf, size_t cap) {
    if (g_torch_from == NULL || fgets(buf, (int)cap, g_torch_from) == NULL) return NULL;
    buf[strcspn(buf, "\n")] = '\0';
    return buf;
}

static int torch_send(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int torch_send(const char *fmt, ...) {
    va_list ap;
    int ok;
    va_start(ap, fmt);
    ok = vfprintf(g_torch_to, fmt, ap) >= 0;
    va_end(ap);
    return ok && fflush(g_torch_to) == 0;
}

/* The environment of the PyTorch process: ours, with the allocator and thread settings that
   make it a fair peer on these machines (glibc keeps freed memory instead of unmapping it, so a
   step does not pay first touches of fresh pages; OpenMP threads sleep as soon as a parallel
   region ends instead of spinning on our cores) and N threads for OpenMP and its BLAS. */
static char **torch_env(void) {
    static char vars[6][64];
    static const char *const names[6] = {"MALLOC_MMAP_MAX_",     "MALLOC_TRIM_THRESHOLD_",
                                         "OMP_WAIT_POLICY",      "OMP_NUM_THREADS",
                                         "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"};
    size_t count = 0, i, k;
    char **env;
    while (environ[count] != NULL)
        count++;
    env = (char **)calloc(count + 7, sizeof(char *));
    if (env == NULL) die("out of memory");
    snprintf(vars[0], sizeof vars[0], "MALLOC_MMAP_MAX_=0");
    snprintf(vars[1], sizeof vars[1], "MALLOC_TRIM_THRESHOLD_=68719476736");
    snprintf(vars[2], sizeof vars[2], "OMP_WAIT_POLICY=PASSIVE");
    snprintf(vars[3], sizeof vars[3], "OMP_NUM_THREADS=%d", g_threads);
    snprintf(vars[4], sizeof vars[4], "OPENBLAS_NUM_THREADS=%d", g_threads);
    snprintf(vars[5], sizeof vars[5], "MKL_NUM_THREADS=%d", g_threads);
    count = 0;
    for (i = 0; environ[i] != NULL; i++) {
        int ours = 0;
        for (k = 0; k < 6; k++) {
            size_t len = strlen(names[k]);
            if (strncmp(environ[i], names[k], len) == 0 && environ[i][len] == '=') ours = 1;
        }
        if (!ours) env[count++] = environ[i];
    }
    for (k = 0; k < 6; k++)
        env[count++] = vars[k];
    return env;
}

void torch_start(const char *script) {
    int to[2], from[2];
    posix_spawn_file_actions_t fa;
    char threads[16], line[400];
    char *argv[4];
    char **env;
    int err;
    if (access(TORCH_PYTHON, X_OK) != 0) {
        snprintf(g_torch_about, sizeof g_torch_about, "skipped: no %s", TORCH_PYTHON);
        return;
    }
    if (access(script, R_OK) != 0) {
        snprintf(g_torch_about, sizeof g_torch_about, "skipped: cannot read %s", script);
        return;
    }
    signal(SIGPIPE, SIG_IGN); /* a PyTorch process that ends is noted, not fatal */
    if (pipe2(to, O_CLOEXEC) != 0 || pipe2(from, O_CLOEXEC) != 0) die("pipe: %s", strerror(errno));
    snprintf(threads, sizeof threads, "%d", g_threads);
    argv[0] = (char *)TORCH_PYTHON;
    argv[1] = (char *)script;
    argv[2] = threads;
    argv[3] = NULL;
    env = torch_env();
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, to[0], 0);
    posix_spawn_file_actions_adddup2(&fa, from[1], 1);
    fflush(stdout);
    err = posix_spawn(&g_torch_pid, TORCH_PYTHON, &fa, NULL, argv, env);
    posix_spawn_file_actions_destroy(&fa);
    free(env);
    close(to[0]);
    close(from[1]);
    if (err != 0) {
        close(to[1]);
        close(from[0]);
        g_torch_pid = -1;
        snprintf(g_torch_about, sizeof g_torch_about, "skipped: cannot start %s: %s", TORCH_PYTHON,
                 strerror(err));
        return;
    }
    g_torch_to = fdopen(to[1], "w");
    g_torch_from = fdopen(from[0], "r");
    if (g_torch_to == NULL || g_torch_from == NULL) die("fdopen: %s", strerror(errno));
    if (torch_line(line, sizeof line) == NULL) {
        snprintf(g_torch_about, sizeof g_torch_about, "skipped: %s %s printed nothing",
                 TORCH_PYTHON, script);
    } else if (strncmp(line, "ready ", 6) == 0) {
        g_torch_ok = 1;
        snprintf(g_torch_about, sizeof g_torch_about, "%s", line + 6);
        make_temp_dir(g_torch_dir, sizeof g_torch_dir, "torch");
        return;
    } else if (strncmp(line, "unavailable ", 12) == 0) {
        snprintf(g_torch_about, sizeof g_torch_about, "skipped: %s", line + 12);
    } else {
        snprintf(g_torch_about, sizeof g_torch_about, "skipped: unexpected answer '%.200s'", line);
    }
    torch_stop();
}

void torch_stop(void) {
    int st;
    if (g_torch_to != NULL) {
        if (g_torch_ok) torch_send("quit\n");
        fclose(g_torch_to);
        g_torch_to = NULL;
    }
    if (g_torch_from != NULL) {
        fclose(g_torch_from);
        g_torch_from = NULL;
    }
    if (g_torch_pid > 0) waitpid(g_torch_pid, &st, 0);
    g_torch_pid = -1;
    g_torch_ok = 0;
    if (g_torch_dir[0] != '\0') remove_tree(g_torch_dir);
    g_torch_dir[0] = '\0';
}

static void write_floats(const char *path, const float *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(data, sizeof(float), n, f) != n || fclose(f) != 0)
        die("cannot write %s: %s", path, strerror(errno));
}

float *torch_setup(const char *kase, const torch_input *in, int n_in, size_t out_n) {
    char cmd[8192], path[1200], line[1024], out_path[1200];
    size_t len, n = 0;
    float *out;
    FILE *f;
    int i;
    if (!g_torch_ok) return NULL;
    snprintf(out_path, sizeof out_path, "%s/out.f32", g_torch_dir);
    len = (size_t)snprintf(cmd, sizeof cmd, "setup %s %s", kase, out_path);
    for (i = 0; i < n_in; i++) {
        size_t numel = (size_t)in[i].dims[0] * (size_t)(in[i].rank > 1 ? in[i].dims[1] : 1);
        snprintf(path, sizeof path, "%s/%s.f32", g_torch_dir, in[i].name);
        write_floats(path, in[i].data, numel);
        len += (size_t)snprintf(cmd + len, sizeof cmd - len, " %s=%s:%lld", in[i].name, path,
                                (long long)in[i].dims[0]);
        if (in[i].rank > 1)
            len += (size_t)snprintf(cmd + len, sizeof cmd - len, "x%lld", (long long)in[i].dims[1]);
    }
    if (!torch_send("%s\n", cmd) || torch_line(line, sizeof line) == NULL) {
        torch_lost(kase);
        return NULL;
    }
    for (i = 0; i < n_in; i++) {
        snprintf(path, sizeof path, "%s/%s.f32", g_torch_dir, in[i].name);
        remove(path);
    }
    if (strncmp(line, "ok ", 3) != 0) {
        note("PyTorch: %s: %s", kase, line);
        return NULL;
    }
    n = (size_t)strtoull(line + 3, NULL, 10);
    if (n != out_n) die("PyTorch %s: %zu result elements, expected %zu", kase, n, out_n);
    out = host_alloc(n);
    f = fopen(out_path, "rb");
    if (f == NULL || fread(out, sizeof(float), n, f) != n) die("cannot read %s", out_path);
    fclose(f);
    remove(out_path);
    return out;
}

double torch_timed(void *unused) {
    char line[256];
    (void)unused;
    if (!g_torch_ok) return NAN;
    if (!torch_send("run\n") || torch_line(line, sizeof line) == NULL) {
        torch_lost("a timed call");
        return NAN;
    }
    if (strncmp(line, "time ", 5) != 0) die("PyTorch: unexpected answer '%.200s'", line);
    {
        char *end = NULL;
        double t = strtod(line + 5, &end);
        g_torch_faults = end != NULL ? strtod(end, NULL) : 0;
        return t;
    }
}

double torch_last_faults(void) {
    return g_torch_faults;
}

/* ======================================================================================
   the memory-bandwidth bound
   ====================================================================================== */

bandwidth g_bw;

/* 16-byte vectors: every x86-64 (and most other CPUs) has them, so -O2 keeps them in
   registers; the loops keep several in flight */
typedef float v4 __attribute__((vector_size(16), may_alias));

enum { BW_FILL, BW_READ, BW_READ4, BW_COPY, BW_COPY_STREAM, BW_TRIAD, BW_OPS };

typedef struct bw_job {
    int op;
    v4 *a, *b, *c;
    size_t lo, hi; /* in v4 units, multiples of 8 */
    float sum;
} bw_job;

#if defined(__x86_64__) && defined(__GNUC__) && defined(__SSE__)
#define BW_HAS_WIDE 1
/* The read and the copy with non-temporal stores in 64-byte vectors where the CPU has AVX-512
   (g_bw.wide): the bench is built for any x86-64, the generated kernels use the CPU's widest
   vectors, and a bound read in 16-byte vectors is one that kernels beat by a few percent.
   [lo, hi) in v4 units, multiples of 8 (128 bytes), over 64-byte aligned buffers. */
__attribute__((target("avx512f"))) static float bw_read_wide(const v4 *a, size_t lo, size_t hi,
                                                             int four) {
    const float *p = (const float *)(a + lo);
    const size_t n = (hi - lo) * 4; /* floats: a multiple of 32 */
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    size_t i;
    if (four) { /* four streams, as BW_READ4 */
        const size_t q = n / 4 / 16 * 16;
        const float *p1 = p + q, *p2 = p1 + q, *p3 = p2 + q;
        for (i = 0; i < q; i += 16) {
            s0 = _mm512_add_ps(s0, _mm512_load_ps(p + i));
            s1 = _mm512_add_ps(s1, _mm512_load_ps(p1 + i));
            s2 = _mm512_add_ps(s2, _mm512_load_ps(p2 + i));
            s3 = _mm512_add_ps(s3, _mm512_load_ps(p3 + i));
        }
        for (i = 4 * q; i < n; i += 16)
            s0 = _mm512_add_ps(s0, _mm512_load_ps(p + i));
    } else {
        for (i = 0; i + 64 <= n; i += 64) {
            s0 = _mm512_add_ps(s0, _mm512_load_ps(p + i));
            s1 = _mm512_add_ps(s1, _mm512_load_ps(p + i + 16));
            s2 = _mm512_add_ps(s2, _mm512_load_ps(p + i + 32));
            s3 = _mm512_add_ps(s3, _mm512_load_ps(p + i + 48));
        }
        for (; i < n; i += 16)
            s0 = _mm512_add_ps(s0, _mm512_load_ps(p + i));
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

__attribute__((target("avx512f"))) static void bw_copy_stream_wide(const v4 *a, v4 *b, size_t lo,
                                                                   size_t hi) {
    const float *p = (const float *)(a + lo);
    float *q = (float *)(b + lo);
    const size_t n = (hi - lo) * 4;
    size_t i;
    for (i = 0; i < n; i += 16)
        _mm512_stream_ps(q + i, _mm512_load_ps(p + i));
    _mm_sfence();
}
#endif

/* The loops: STREAM's copy (b = a) and triad (a = b + s c), and a read (the sum of a) with
   eight vector accumulators. The empty asm keeps the compiler from making the copy a memcpy
   call. The copy is also timed with non-temporal stores (x86), as glibc's large copies and the
   generated kernels that write large outputs store: the written lines are not read first, so
   the memory moves only what the copy counts. */
static void *bw_work(void *arg) {
    bw_job *j = (bw_job *)arg;
    v4 *a = j->a, *b = j->b, *c = j->c;
    const v4 one = {1, 1, 1, 1}, three = {3, 3, 3, 3};
    const size_t lo = j->lo, hi = j->hi;
    size_t i;
#ifdef BW_HAS_WIDE
    if (g_bw.wide && (j->op == BW_READ || j->op == BW_READ4)) {
        j->sum = bw_read_wide(a, lo, hi, j->op == BW_READ4);
        return NULL;
    }
    if (g_bw.wide && j->op == BW_COPY_STREAM) {
        bw_copy_stream_wide(a, b, lo, hi);
        return NULL;
    }
#endif
    switch (j->op) {
    case BW_FILL:
        for (i = lo; i < hi; i++) {
            a[i] = one;
            b[i] = one + one;
            c[i] = one;
        }
        break;
    case BW_READ: {
        v4 s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0}, s4 = {0}, s5 = {0}, s6 = {0}, s7 = {0};
        for (i = lo; i < hi; i += 8) {
            s0 += a[i];
            s1 += a[i + 1];
            s2 += a[i + 2];
            s3 += a[i + 3];
            s4 += a[i + 4];
            s5 += a[i + 5];
            s6 += a[i + 6];
            s7 += a[i + 7];
        }
        s0 = (s0 + s1) + (s2 + s3) + ((s4 + s5) + (s6 + s7));
        j->sum = s0[0] + s0[1] + s0[2] + s0[3];
        break;
    }
    case BW_READ4: { /* four streams at once: more misses in flight on cores that need it */
        const size_t q = (hi - lo) / 4 / 2 * 2;
        const v4 *p0 = a + lo, *p1 = p0 + q, *p2 = p1 + q, *p3 = p2 + q;
        v4 s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0}, s4 = {0}, s5 = {0}, s6 = {0}, s7 = {0};
        for (i = 0; i < q; i += 2) {
            s0 += p0[i];
            s1 += p0[i + 1];
            s2 += p1[i];
            s3 += p1[i + 1];
            s4 += p2[i];
            s5 += p2[i + 1];
            s6 += p3[i];
            s7 += p3[i + 1];
        }
        for (i = lo + 4 * q; i < hi; i++)
            s0 += a[i];
        s0 = (s0 + s1) + (s2 + s3) + ((s4 + s5) + (s6 + s7));
        j->sum = s0[0] + s0[1] + s0[2] + s0[3];
        break;
    }
    case BW_COPY:
        for (i = lo; i < hi; i += 8) {
            b[i] = a[i];
            b[i + 1] = a[i + 1];
            b[i + 2] = a[i + 2];
            b[i + 3] = a[i + 3];
            b[i + 4] = a[i + 4];
            b[i + 5] = a[i + 5];
            b[i + 6] = a[i + 6];
            b[i + 7] = a[i + 7];
            __asm__ volatile("" ::: "memory");
        }
        break;
    case BW_COPY_STREAM:
#if defined(__SSE__)
        for (i = lo; i < hi; i++)
            _mm_stream_ps((float *)&b[i], (__m128)a[i]);
        _mm_sfence();
#else
        for (i = lo; i < hi; i++)
            b[i] = a[i];
#endif
        break;
    default:
        for (i = lo; i < hi; i++)
            a[i] = b[i] + three * c[i];
        break;
    }
    return NULL;
}

/* One pass of `op` over the buffers on g_threads threads (the caller is one of them). */
static double bw_pass(int op, v4 *a, v4 *b, v4 *c, size_t vecs) {
    pthread_t th[256];
    bw_job jobs[256];
    int t, n = g_threads < 256 ? g_threads : 256, started = 0;
    double t0 = now_s(), dt;
    for (t = 0; t < n; t++) {
        jobs[t].op = op;
        jobs[t].a = a;
        jobs[t].b = b;
        jobs[t].c = c;
        jobs[t].lo = vecs * (size_t)t / (size_t)n / 8 * 8;
        jobs[t].hi = vecs * (size_t)(t + 1) / (size_t)n / 8 * 8;
    }
    for (t = 1; t < n; t++) {
        if (pthread_create(&th[t], NULL, bw_work, &jobs[t]) != 0) die("pthread_create");
        started = t;
    }
    bw_work(&jobs[0]);
    for (t = 1; t <= started; t++)
        pthread_join(th[t], NULL);
    dt = now_s() - t0;
    if (op == BW_READ || op == BW_READ4) {
        float s = 0;
        for (t = 0; t < n; t++)
            s += jobs[t].sum;
        if (s != s) die("bandwidth: NaN"); /* uses the sums */
    }
    return dt;
}

static double l3_bytes(void) {
    long v = sysconf(_SC_LEVEL3_CACHE_SIZE);
    FILE *f;
    char buf[64];
    if (v > 0) return (double)v;
    f = fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "r");
    if (f == NULL) return 0;
    if (fgets(buf, sizeof buf, f) != NULL) {
        double k = atof(buf);
        fclose(f);
        return strchr(buf, 'M') != NULL ? k * 1048576.0 : k * 1024.0;
    }
    fclose(f);
    return 0;
}

static v4 *g_bw_a, *g_bw_b, *g_bw_c;
static size_t g_bw_vecs;
static int g_bw_read_op = BW_READ4; /* the faster read over the whole buffers */

/* Best of `runs` passes of each loop, in bytes per second (STREAM's counting). */
/* Best of `runs` passes of each loop over the first `vecs` of the buffers, in bytes per second
   (STREAM's counting); read is the better of one and four streams per thread, copy_stream the
   copy with non-temporal stores. */
static void bw_runs(int runs, size_t vecs, double *read, double *copy, double *copy_stream,
                    double *triad) {
    double best[BW_OPS] = {INFINITY, INFINITY, INFINITY, INFINITY, INFINITY, INFINITY};
    double bytes = (double)vecs * sizeof(v4);
    int r, op;
    for (r = 0; r < runs; r++) {
        for (op = BW_READ; op < BW_OPS; op++) {
            double t = bw_pass(op, g_bw_a, g_bw_b, g_bw_c, vecs);
            if (t < best[op]) best[op] = t;
        }
    }
    *read = bytes / (best[BW_READ] < best[BW_READ4] ? best[BW_READ] : best[BW_READ4]);
    if (vecs == g_bw_vecs) g_bw_read_op = best[BW_READ] < best[BW_READ4] ? BW_READ : BW_READ4;
    *copy = 2 * bytes / best[BW_COPY];
    *copy_stream = 2 * bytes / best[BW_COPY_STREAM];
    *triad = 3 * bytes / best[BW_TRIAD];
}

void measure_bandwidth(void) {
    double mem = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    double bytes;
    g_bw.l3_bytes = l3_bytes();
#ifdef BW_HAS_WIDE
    g_bw.wide = __builtin_cpu_supports("avx512f") ? 1 : 0;
#endif
    /* three buffers, each twice the last-level cache, 256 MiB to 1 GiB (and at most a 16th of
       the memory); --quick: 64 MiB */
    bytes = 2.0 * g_bw.l3_bytes;
    if (bytes < 256.0 * 1048576) bytes = 256.0 * 1048576;
    if (bytes > 1024.0 * 1048576) bytes = 1024.0 * 1048576;
    if (mem > 0 && bytes > mem / 16) bytes = mem / 16;
    if (g_quick) bytes = 64.0 * 1048576;
    g_bw_vecs = (size_t)(bytes / sizeof(v4)) / 8 * 8;
    g_bw.buffer_bytes = (double)g_bw_vecs * sizeof(v4);
    if (posix_memalign((void **)&g_bw_a, 64, g_bw_vecs * sizeof(v4)) != 0 ||
        posix_memalign((void **)&g_bw_b, 64, g_bw_vecs * sizeof(v4)) != 0 ||
        posix_memalign((void **)&g_bw_c, 64, g_bw_vecs * sizeof(v4)) != 0)
        die("out of memory for the bandwidth buffers");
    /* first touch, on the threads that use each part */
    bw_pass(BW_FILL, g_bw_a, g_bw_b, g_bw_c, g_bw_vecs);
    g_bw.runs = g_quick ? 2 : 10;
    bw_runs(g_bw.runs, g_bw_vecs, &g_bw.read, &g_bw.copy, &g_bw.copy_stream, &g_bw.triad);
    g_bw.measured = 1;
    /* the same loops over 64 MiB buffers, the size of the cases' large tensors: what part of
       such data the caches keep shows here */
    bytes = 64.0 * 1048576;
    g_bw.small_bytes = bytes < g_bw.buffer_bytes ? bytes : g_bw.buffer_bytes;
    bw_runs(g_quick ? 2 : 20, (size_t)(g_bw.small_bytes / sizeof(v4)) / 8 * 8, &g_bw.small_read,
            &g_bw.small_copy, &g_bw.small_copy_stream, &g_bw.small_triad);
}

double flush_caches(void) {
    double t0 = now_s();
    if (g_bw_a != NULL) bw_pass(BW_READ, g_bw_a, g_bw_b, g_bw_c, g_bw_vecs);
    return now_s() - t0;
}

void bandwidth_end(void) {
    double read, copy, copy_stream, triad;
    if (g_bw_a == NULL) return;
    bw_runs(g_quick ? 2 : 5, g_bw_vecs, &read, &copy, &copy_stream, &triad);
    note("bandwidth (best of %d) before the bandwidth cases: read %.2f GB/s, copy %.2f GB/s, "
         "copy with non-temporal stores %.2f GB/s, triad %.2f GB/s; after them (best of %d): "
         "%.2f, %.2f, %.2f, %.2f; the bound uses the better of each",
         g_bw.runs, g_bw.read / 1e9, g_bw.copy / 1e9, g_bw.copy_stream / 1e9, g_bw.triad / 1e9,
         g_quick ? 2 : 5, read / 1e9, copy / 1e9, copy_stream / 1e9, triad / 1e9);
    if (read > g_bw.read) g_bw.read = read;
    if (copy > g_bw.copy) g_bw.copy = copy;
    if (copy_stream > g_bw.copy_stream) g_bw.copy_stream = copy_stream;
    if (triad > g_bw.triad) g_bw.triad = triad;
    g_bw.measured = 2;
    free(g_bw_a);
    free(g_bw_b);
    free(g_bw_c);
    g_bw_a = g_bw_b = g_bw_c = NULL;
}

/* Writing cases: the best of copy (with plain or non-temporal stores) and triad. Read-only
   cases: the best of all (plain copy and triad count no write-allocate reads, so the memory
   moved more than they count: reading at their rate is possible). */
double bound_time(double bytes, int writes) {
    double bw = g_bw.copy > g_bw.triad ? g_bw.copy : g_bw.triad;
    if (g_bw.copy_stream > bw) bw = g_bw.copy_stream;
    if (!writes && g_bw.read > bw) bw = g_bw.read;
    return bw > 0 ? bytes / bw : NAN;
}

typedef struct bound_ctx {
    int op;
    size_t vecs;
} bound_ctx;

static void bound_run(void *p) {
    const bound_ctx *c = (const bound_ctx *)p;
    /* never a (the flush reads it and leaves its end in the caches): a read of b, a copy of c
       into b */
    if (c->op == BW_READ) {
        bw_pass(g_bw_read_op, g_bw_b, g_bw_a, g_bw_c, c->vecs);
    } else {
        bw_pass(c->op, g_bw_c, g_bw_b, g_bw_a, c->vecs);
    }
}

int bound_side(side *s, double bytes, int writes) {
    static bound_ctx ctx[2];
    bound_ctx *c = &ctx[writes != 0];
    size_t vecs = (size_t)(bytes / (writes ? 2.0 : 1.0) / sizeof(v4)) / 32 * 32;
    if (g_quick || g_bw_a == NULL || vecs == 0 || vecs > g_bw_vecs) return 0;
    c->op = writes ? BW_COPY_STREAM : BW_READ;
    c->vecs = vecs;
    memset(s, 0, sizeof *s);
    s->name = "bound";
    s->run = bound_run;
    s->ctx = c;
    s->flush = 1;
    return 1;
}

void note_footprints(void) {
    if (g_quick) {
        note("--quick: the bandwidth buffers are 64 MiB, which the caches may partly hold: the "
             "bound is not a memory bound");
        return;
    }
    note("bandwidth over %.0f MiB buffers (the size of a 16M-float tensor; best of %d): read %.2f "
         "GB/s, copy %.2f GB/s, triad %.2f GB/s, against %.2f, %.2f, %.2f over %.0f MiB: where "
         "the first are higher, the caches keep part of such data; the bandwidth cases flush "
         "the caches before each timed call (every side), so they stream from memory as the "
         "bound does",
         g_bw.small_bytes / 1048576.0, g_quick ? 2 : 20, g_bw.small_read / 1e9,
         g_bw.small_copy / 1e9, g_bw.small_triad / 1e9, g_bw.read / 1e9, g_bw.copy / 1e9,
         g_bw.triad / 1e9, g_bw.buffer_bytes / 1048576.0);
}

/* ======================================================================================
   OpenBLAS and CLBlast
   ====================================================================================== */

int have_openblas(void) {
#ifdef BENCH_OPENBLAS
    return 1;
#else
    return 0;
#endif
}

int have_clblast(void) {
#ifdef BENCH_CLBLAST
    return 1;
#else
    return 0;
#endif
}

void openblas_setup(void) {
#ifdef BENCH_OPENBLAS
    openblas_set_num_threads(g_threads);
#endif
}

const char *openblas_about(void) {
#ifdef BENCH_OPENBLAS
    static char buf[512];
    snprintf(buf, sizeof buf, "%s, %d threads", openblas_get_config(), openblas_get_num_threads());
    return buf;
#else
    return "not installed (libopenblas-dev): its anchors are skipped";
#endif
}

/* c = a b + beta c, row-major, a m x k, b k x n. */
void openblas_sgemm(int m, int n, int k, const float *a, const float *b, float beta, float *c) {
    openblas_gemm(0, 0, m, n, k, a, b, beta, c);
}

/* c = op(a) op(b) + beta c, row-major, op(a) m x k, op(b) k x n; a is stored k x m when
   trans_a, b n x k when trans_b. */
void openblas_gemm(int trans_a, int trans_b, int m, int n, int k, const float *a, const float *b,
                   float beta, float *c) {
#ifdef BENCH_OPENBLAS
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, m, n, k, 1.0f, a, trans_a ? m : k, b,
                trans_b ? k : n, beta, c, n);
#else
    (void)trans_a, (void)trans_b, (void)m, (void)n, (void)k, (void)a, (void)b, (void)beta, (void)c;
    die("OpenBLAS is not built in");
#endif
}

void clblast_sgemm(int n, cl_mem a, cl_mem b, cl_mem c) {
#ifdef BENCH_CLBLAST
    size_t s = (size_t)n;
    CLBlastStatusCode st =
        CLBlastSgemm(CLBlastLayoutRowMajor, CLBlastTransposeNo, CLBlastTransposeNo, s, s, s, 1.0f,
                     a, 0, s, b, 0, s, 0.0f, c, 0, s, &g_queue, NULL);
    if (st != CLBlastSuccess) die("CLBlastSgemm: status %d", (int)st);
    finish();
#else
    (void)n, (void)a, (void)b, (void)c;
    die("CLBlast is not built in");
#endif
}
