/* The benchmark's common parts: failing loudly, notes, rows (table and JSON), timing sides in
   alternation, data and result checks, the backends, child processes. */
#define _GNU_SOURCE
#include "bench.h"

#include <errno.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int g_quick;
FILE *g_json;
char g_self[4096];
tb_device g_cpu;
bench_backend g_backends[NUM_BACKENDS] = {{"opencl", 0, 1, {{0}, 0, 0}, ""},
                                          {"native", 0, 0, {{0}, 0, 0}, ""}};
int g_threads = 1;
cl_platform_id g_platform;
cl_device_id g_device;
cl_context g_context;
cl_command_queue g_queue;

/* ---- failing loudly ---- */

void die(const char *fmt, ...) {
    va_list ap;
    fflush(stdout);
    fprintf(stderr, "bench: FAIL: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    exit(1);
}

tb_tensor *need(tb_tensor *t, const char *what) {
    if (t == NULL) die("%s: %s", what, tb_last_error());
    return t;
}

void need_ok(tb_status st, const char *what) {
    if (st != TB_OK) die("%s: %s (%s)", what, tb_last_error(), tb_status_string(st));
}

void cl_need(cl_int err, const char *what) {
    if (err != CL_SUCCESS) die("%s: OpenCL error %d", what, (int)err);
}

static char g_notes[32768];

void note(const char *fmt, ...) {
    size_t len = strlen(g_notes);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_notes + len, sizeof g_notes - len, fmt, ap);
    va_end(ap);
    len = strlen(g_notes);
    if (len + 1 < sizeof g_notes) {
        g_notes[len] = '\n';
        g_notes[len + 1] = '\0';
    }
}

const char *notes_text(void) {
    return g_notes;
}

/* ---- rows ---- */

static row g_rows[160];
static int g_num_rows;

row row_new(const char *name, const char *backend) {
    row r;
    memset(&r, 0, sizeof r);
    snprintf(r.name, sizeof r.name, "%s", name);
    snprintf(r.backend, sizeof r.backend, "%s", backend);
    r.ours = r.torch = r.bound = r.anchor = r.value = r.bytes = r.flops = NAN;
    return r;
}

static double ratio(double a, double b) {
    return a > 0 && b > 0 ? a / b : NAN;
}

static void fmt_time(double s, char *buf, size_t cap) {
    if (!(s >= 0)) {
        snprintf(buf, cap, "-");
    } else if (s >= 1.0) {
        snprintf(buf, cap, "%.3f s", s);
    } else if (s >= 1e-3) {
        snprintf(buf, cap, "%.3f ms", s * 1e3);
    } else {
        snprintf(buf, cap, "%.3f us", s * 1e6);
    }
}

static void fmt_num(double v, const char *fmt, char *buf, size_t cap) {
    if (isfinite(v)) {
        snprintf(buf, cap, fmt, v);
    } else {
        snprintf(buf, cap, "-");
    }
}

void print_header(void) {
    printf("  %-20s %-7s %11s %11s %7s %11s %6s  %-20s %-15s %11s %7s %4s\n", "case", "backend",
           "ours", "pytorch", "pt/ours", "bound", "of bnd", "rate (ours)", "anchor", "anchor time",
           "an/ours", "reps");
}

static void print_row(const row *r) {
    char ours[24], pt[24], ptr[16], bound[24], frac[16], rate[40], an[24], anr[16];
    fmt_time(r->ours, ours, sizeof ours);
    fmt_time(r->torch, pt, sizeof pt);
    fmt_num(ratio(r->torch, r->ours), "%.2f", ptr, sizeof ptr);
    fmt_time(r->bound, bound, sizeof bound);
    fmt_num(ratio(r->bound, r->ours) * 100.0, "%.0f%%", frac, sizeof frac);
    if (isfinite(r->value)) {
        snprintf(rate, sizeof rate, "%.3f %s", r->value, r->unit);
    } else {
        snprintf(rate, sizeof rate, "- %s", r->unit);
    }
    fmt_time(r->anchor, an, sizeof an);
    fmt_num(ratio(r->anchor, r->ours), "%.2f", anr, sizeof anr);
    printf("  %-20s %-7s %11s %11s %7s %11s %6s  %-20s %-15s %11s %7s %4d\n", r->name, r->backend,
           ours, pt, ptr, bound, frac, rate, r->anchor_name[0] ? r->anchor_name : "-", an, anr,
           r->reps);
}

static void json_num(FILE *f, const char *key, double v) {
    fprintf(f, ", \"%s\": ", key);
    if (isfinite(v)) {
        fprintf(f, "%.9g", v);
    } else {
        fprintf(f, "null");
    }
}

static void json_str(FILE *f, const char *key, const char *v) {
    fprintf(f, ", \"%s\": ", key);
    if (v[0] == '\0') {
        fprintf(f, "null");
    } else {
        fprintf(f, "\"%s\"", v); /* our own names: no quotes or backslashes in them */
    }
}

static int g_held = -1; /* the first held row, -1: none held */

static void emit_row(const row *r) {
    print_row(r);
    fflush(stdout);
    if (g_json != NULL) {
        fprintf(g_json, "{\"case\": \"%s\"", r->name);
        json_str(g_json, "backend", r->backend);
        json_num(g_json, "ours", r->ours);
        json_num(g_json, "pytorch", r->torch);
        json_num(g_json, "ratio_pytorch", ratio(r->torch, r->ours));
        json_num(g_json, "bound", r->bound);
        json_str(g_json, "bound_kind", r->bound_kind);
        json_num(g_json, "frac_bound", ratio(r->bound, r->ours));
        json_num(g_json, "rate", r->value);
        json_str(g_json, "unit", r->unit);
        json_str(g_json, "anchor_name", r->anchor_name);
        json_num(g_json, "anchor", r->anchor);
        json_num(g_json, "ratio_anchor", ratio(r->anchor, r->ours));
        json_num(g_json, "bytes", r->bytes);
        json_num(g_json, "flops", r->flops);
        fprintf(g_json, ", \"reps\": %d}\n", r->reps);
        fflush(g_json);
    }
}

void add_row(const row *r) {
    if (g_num_rows >= (int)(sizeof g_rows / sizeof g_rows[0])) die("too many rows");
    g_rows[g_num_rows++] = *r;
    if (g_held < 0) emit_row(r);
}

void hold_rows(void) {
    if (g_held < 0) g_held = g_num_rows;
}

void release_rows(void) {
    int i;
    if (g_held < 0) return;
    for (i = g_held; i < g_num_rows; i++) {
        row *r = &g_rows[i];
        if (strcmp(r->bound_kind, "bandwidth") == 0) r->bound = bound_time(r->bytes, r->writes);
        emit_row(r);
    }
    g_held = -1;
}

/* One JSON object of facts about the run (the machine, the peers, the bound), not a row. */
void json_machine(const char *fmt, ...) {
    va_list ap;
    if (g_json == NULL) return;
    va_start(ap, fmt);
    vfprintf(g_json, fmt, ap);
    va_end(ap);
    fprintf(g_json, "\n");
    fflush(g_json);
}

void print_table(void) {
    int i;
    printf("\n");
    print_header();
    for (i = 0; i < g_num_rows; i++)
        print_row(&g_rows[i]);
}

/* ---- timing ---- */

double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : (x > y ? 1 : 0);
}

double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double time_once(run_fn fn, void *ctx) {
    double t0 = now_s();
    fn(ctx);
    return now_s() - t0;
}

static double call_once(side *s) {
    return s->timed != NULL ? s->timed(s->ctx) : time_once(s->run, s->ctx);
}

static double minor_faults(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_minflt;
}

/* One timed call (after its prime and flush); *faults gets the minor page faults it took:
   fresh memory touched for the first time (slow on some virtual machines). */
static double call_side(side *s, double *faults) {
    double t, f0;
    if (s->prime && s->t < 0.5) call_once(s);
    if (s->flush) flush_caches();
    f0 = minor_faults();
    t = call_once(s);
    *faults = s->timed == torch_timed ? torch_last_faults() : minor_faults() - f0;
    s->t = t; /* the last call's, until measure sets the median */
    if (s->cooldown > 0) usleep((useconds_t)(s->cooldown * 1e6));
    return t;
}

/* Rounds for a case whose sides take `round_s` together (the slowest call `slowest`): about 8 s
   in a full run, 5 to 21 rounds (3 when one call takes seconds); with --quick 3 when a round
   is short, else 1. */
static int reps_for(double round_s, double slowest) {
    int r;
    if (g_quick) return round_s < 0.2 ? 3 : 1;
    if (slowest > 2.0) return 3;
    r = (int)(8.0 / (round_s > 1e-6 ? round_s : 1e-6));
    if (r < 5) r = 5;
    if (r > 21) r = 21;
    return r;
}

static uint64_t g_order_rng = 0x2545F4914F6CDD1Dull; /* the sides' order in each round */

int measure(side *s, int n, int force_reps) {
    double round_s = 0, slowest = 0, tmp[64];
    int reps, r, j, k;
    /* two warm-up rounds: the first call compiled (ours) or was the check; allocators reach
       their steady state (glibc's heap under PyTorch grows for a few calls) */
    for (r = 0; r < 2; r++)
        for (j = 0; j < n; j++)
            call_side(&s[j], &s[j].faults[0]);
    for (j = 0; j < n; j++) {
        double t = call_side(&s[j], &s[j].faults[0]);
        s[j].samples[0] = t;
        round_s += t * (s[j].prime ? 2 : 1) + s[j].cooldown;
        if (s[j].flush) round_s += flush_caches();
        if (t > slowest) slowest = t;
    }
    reps = force_reps > 0 ? force_reps : reps_for(round_s, slowest);
    if (reps > 64) reps = 64;
    for (r = 1; r < reps; r++) {
        int order[64];
        /* a fresh order every round: each side follows every other about as often, so that
           none always pays for the same predecessor (a runtime switch, a BLAS pool waking) */
        for (k = 0; k < n; k++)
            order[k] = k;
        for (k = n - 1; k > 0; k--) {
            int m, t;
            g_order_rng = g_order_rng * 6364136223846793005ull + 1442695040888963407ull;
            m = (int)((g_order_rng >> 33) % (uint64_t)(k + 1));
            t = order[k];
            order[k] = order[m];
            order[m] = t;
        }
        for (k = 0; k < n; k++) {
            j = order[k];
            s[j].samples[r] = call_side(&s[j], &s[j].faults[r]);
        }
    }
    for (j = 0; j < n; j++) {
        memcpy(tmp, s[j].samples, (size_t)reps * sizeof(double));
        s[j].t = median(tmp, reps);
        memcpy(tmp, s[j].faults, (size_t)reps * sizeof(double));
        s[j].faults_med = median(tmp, reps);
    }
    return reps;
}

void note_faults(const char *name, const side *s, int n) {
    char buf[512];
    size_t len = 0;
    int j, any = 0;
    for (j = 0; j < n; j++) {
        any |= s[j].faults_med > 0;
        len += (size_t)snprintf(buf + len, sizeof buf - len, "%s%s %.0f", j > 0 ? ", " : "",
                                s[j].name, s[j].faults_med);
        if (len >= sizeof buf) break;
    }
    if (any) note("%s: minor page faults per timed call (median; fresh memory): %s", name, buf);
}

/* ---- data ---- */

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;

void seed_rng(uint64_t seed) {
    g_rng = seed * 0x9E3779B97F4A7C15ull + 1;
}

static float urand(void) { /* uniform in [-1, 1) */
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(g_rng >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
}

float *host_alloc(size_t n) {
    float *p = (float *)malloc((n > 0 ? n : 1) * sizeof(float));
    if (p == NULL) die("out of host memory (%zu floats)", n);
    return p;
}

float *host_random(size_t n, float scale) {
    float *p = host_alloc(n);
    size_t i;
    for (i = 0; i < n; i++)
        p[i] = urand() * scale;
    return p;
}

tb_tensor *upload(const float *h, int32_t rank, const int64_t *dims, const tb_device *dev) {
    tb_shape s;
    need_ok(tb_shape_make(&s, TB_F32, rank, dims), "tb_shape_make");
    return need(tb_tensor_from_host(h, &s, dev), "tb_tensor_from_host");
}

size_t numel_of(tb_tensor *t) {
    tb_shape s = tb_tensor_shape(t);
    int64_t n = 0;
    need_ok(tb_shape_numel(&s, &n), "tb_shape_numel");
    return (size_t)n;
}

float *to_host(tb_tensor *t) {
    size_t n = numel_of(t);
    float *h = host_alloc(n);
    need_ok(tb_tensor_to_host(t, h, n * sizeof(float)), "tb_tensor_to_host");
    return h;
}

void sync_on(tb_tensor *t, const bench_backend *be) {
    need_ok(tb_sync(&t, 1), "tb_sync");
    if (be->opencl) finish();
}

void check_close(const char *what, const float *got, const float *want, size_t n, double atol,
                 double rtol) {
    size_t i;
    for (i = 0; i < n; i++) {
        double g = got[i], w = want[i];
        double err = fabs(g - w), tol = atol + rtol * fabs(w);
        if (isnan(g) != isnan(w) || (!isnan(w) && !(err <= tol))) {
            die("%s: element %zu is %.9g, expected %.9g (tolerance %.3g); %zu elements checked",
                what, i, g, w, tol, n);
        }
    }
}

double backend_counter(const char *backend, const char *name) {
    char *text = tb_backend_metrics_report(backend), *p;
    size_t len = strlen(name);
    double sum = 0;
    if (text == NULL) return 0;
    for (p = text; p != NULL && *p != '\0';) {
        char *q = p;
        while (*q == ' ')
            q++;
        if (strncmp(q, name, len) == 0 && q[len] == ':') sum += atof(q + len + 1);
        p = strchr(p, '\n');
        if (p != NULL) p++;
    }
    tb_free(text);
    return sum;
}

/* ---- OpenCL helpers ---- */

void finish(void) {
    cl_need(clFinish(g_queue), "clFinish");
}

cl_mem tensor_mem(tb_tensor *t) {
    void *mem = NULL;
    size_t size = 0;
    need_ok(tb_opencl_tensor_buffer(t, &mem, &size), "tb_opencl_tensor_buffer");
    return (cl_mem)mem;
}

cl_mem cl_buffer(size_t bytes) {
    cl_int err = CL_SUCCESS;
    cl_mem m = clCreateBuffer(g_context, CL_MEM_READ_WRITE, bytes > 0 ? bytes : 4, NULL, &err);
    cl_need(err, "clCreateBuffer");
    return m;
}

float *cl_read(cl_mem m, size_t n) {
    float *h = host_alloc(n);
    cl_need(clEnqueueReadBuffer(g_queue, m, CL_TRUE, 0, n * sizeof(float), h, 0, NULL, NULL),
            "clEnqueueReadBuffer");
    return h;
}

/* ---- the backends ---- */

static void open_opencl(bench_backend *be) {
    tb_opencl_native nat;
    size_t count = 0;
    if (tb_opencl_available() != TB_OK) {
        snprintf(be->why, sizeof be->why, "%s", tb_last_error());
        return;
    }
    if (tb_backend_devices("opencl", NULL, 0, &count) != TB_OK || count == 0) {
        snprintf(be->why, sizeof be->why, "no OpenCL device");
        return;
    }
    need_ok(tb_device_make("opencl", 0, &be->dev), "tb_device_make opencl:0");
    need_ok(tb_opencl_native_device(&be->dev, &nat), "tb_opencl_native_device");
    g_platform = (cl_platform_id)nat.platform;
    g_device = (cl_device_id)nat.device;
    g_context = (cl_context)nat.context;
    g_queue = (cl_command_queue)nat.queue;
    be->ok = 1;
}

static void open_native(bench_backend *be) {
    size_t count = 0;
    if (!tb_has_backend("native")) {
        snprintf(be->why, sizeof be->why, "not built into this torch_backend.h");
        return;
    }
    if (tb_backend_devices("native", NULL, 0, &count) != TB_OK || count == 0) {
        char *report = tb_backend_metrics_report("native");
        snprintf(be->why, sizeof be->why, "%s", report != NULL ? report : "no device");
        be->why[strcspn(be->why, "\n")] = '\0';
        tb_free(report);
        return;
    }
    need_ok(tb_device_make("native", 0, &be->dev), "tb_device_make native:0");
    be->ok = 1;
}

void open_backends(int want_opencl, int want_native) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    const char *env = getenv("TB_NATIVE_THREADS");
    need_ok(tb_device_make("cpu", 0, &g_cpu), "tb_device_make cpu:0");
    if (want_opencl) open_opencl(&g_backends[0]);
    if (want_native) open_native(&g_backends[1]);
    /* the native backend's threads: one per online core unless TB_NATIVE_THREADS says */
    g_threads = cores > 0 ? (int)cores : 1;
    if (env != NULL && atoi(env) > 0) g_threads = atoi(env);
    if (g_backends[1].ok) {
        tb_device_info info;
        memset(&info, 0, sizeof info);
        if (tb_backend_device_info(&g_backends[1].dev, &info) == TB_OK && info.compute_units > 0)
            g_threads = (int)info.compute_units;
    }
}

bench_backend *backend_named(const char *name) {
    int i;
    for (i = 0; i < NUM_BACKENDS; i++)
        if (strcmp(g_backends[i].name, name) == 0) return &g_backends[i];
    return NULL;
}

/* ---- child processes and temporary folders ---- */

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

void remove_tree(const char *dir) {
    nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

void make_temp_dir(char *out, size_t cap, const char *tag) {
    const char *base = getenv("TMPDIR");
    snprintf(out, cap, "%s/tb_bench_%s_XXXXXX", base != NULL && base[0] ? base : "/tmp", tag);
    if (mkdtemp(out) == NULL) die("mkdtemp %s: %s", out, strerror(errno));
}

int run_child(const char *mode, const char *backend, const char *env, char *out, size_t cap) {
    char cmd[8192];
    FILE *p;
    size_t len = 0;
    int st;
    snprintf(cmd, sizeof cmd, "env %s '%s' --child %s %s%s", env, g_self, mode, backend,
             g_quick ? " --quick" : "");
    fflush(stdout);
    p = popen(cmd, "r");
    if (p == NULL) return -1;
    while (len + 1 < cap) {
        size_t got = fread(out + len, 1, cap - 1 - len, p);
        if (got == 0) break;
        len += got;
    }
    out[len] = '\0';
    st = pclose(p);
    if (st != 0) {
        fprintf(stderr, "bench: child '%s %s' failed (status %d); its output:\n%s\n", mode, backend,
                st, out);
    }
    return st;
}
