/* The compiled-backend suite's harness: the backend under test (TEST_BACKEND, set by the
   program that includes the suite), its device and the cpu backend's, random host data, the
   comparison of a graph's results on both backends, the checks of the names in generated
   kernels, and views applied to operands. Part of tests/backend_suite/suite.c. */
#define _POSIX_C_SOURCE 200809L /* setenv, mkdtemp, truncate */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#define TB_IMPLEMENTATION
#include "torch_backend.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <pthread.h>
#include <time.h>

/* The backend under test: "opencl" unless the program defines TEST_BACKEND (tests/test_native.c,
   tests/test_kit.c); the tests of OpenCL's own machinery (OPENCL_ONLY) run for "opencl" only. */
#ifndef TEST_BACKEND
#define TEST_BACKEND "opencl"
#define TEST_OPENCL  1
#else
#define TEST_OPENCL 0
#endif

#if defined(TB_NO_OPENCL) || !TEST_OPENCL
/* the hooks of the backend the tests below reach (they skip themselves without it) */
static uint64_t tb__ocl_program_key_mask;
static uint32_t tb__disk_counter;
#endif

/* ---- state ---- */

static bool g_have_opencl;
static char g_reason[1024];
/* TB_TEST_SMALL=1 (tools/oclgrind.sh, for a simulated device): tests leave out the cases whose
   sizes only matter to a real device's code paths (reductions over millions of elements) */
static bool g_small;
static tb_device g_cpu, g_ocl;
static uint64_t g_rng = 0x2545F4914F6CDD1Dull;

static void probe(void) {
    tb_device probe_dev;
    tb_status st;
#ifdef TEST_BACKEND_SETUP
    TEST_BACKEND_SETUP(); /* a backend that is not built in registers itself here */
#endif
    st = TEST_OPENCL ? tb_opencl_available() : tb_device_make(TEST_BACKEND, 0, &probe_dev);
    g_have_opencl = st == TB_OK;
    if (!g_have_opencl) {
        snprintf(g_reason, sizeof g_reason, "%s", tb_last_error());
    } else {
        assert_int_equal(tb_device_make(TEST_BACKEND, 0, &g_ocl), TB_OK);
    }
    assert_int_equal(tb_device_make("cpu", 0, &g_cpu), TB_OK);
}

#define REQUIRE_OPENCL()                                                                           \
    do {                                                                                           \
        if (!g_have_opencl) {                                                                      \
            print_message("no OpenCL device, skipped: %s\n", g_reason);                            \
            skip();                                                                                \
        }                                                                                          \
    } while (0)

/* A test of OpenCL's own machinery (devices, the program cache on disk, the loader): in an
   area's list, run for "opencl" only. The mark is the test's initial state, which it ignores. */
static const int g_opencl_only = 1;
#define OPENCL_ONLY(f) cmocka_unit_test_prestate(f, (void *)&g_opencl_only)

static int group_setup(void **state) {
    (void)state;
    g_small = getenv("TB_TEST_SMALL") != NULL && strcmp(getenv("TB_TEST_SMALL"), "1") == 0;
    probe();
    if (!g_have_opencl) print_message("OpenCL is not available here: %s\n", g_reason);
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    tb_shutdown();
    return 0;
}

/* the library's log lines, for a test that sets desc.logger.func = capture_log */
static char g_log[65536];

static void capture_log(tb_log_level level, const char *message, void *user_data) {
    size_t n = strlen(g_log);
    (void)level;
    (void)user_data;
    snprintf(g_log + n, sizeof g_log - n, "%s\n", message);
}

/* tb_shutdown and tb_setup: a fresh library (caches, devices) */
static void restart_library(void) {
    tb__ocl_program_key_mask = ~(uint64_t)0; /* a failed test may have left it cleared */
    tb_shutdown();
    assert_int_equal(tb_setup(NULL), TB_OK);
}

static uint32_t rnd_u32(void) {
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    return (uint32_t)((g_rng * 0x2545F4914F6CDD1Dull) >> 32);
}

static double rnd_unit(void) {
    return (double)rnd_u32() / 4294967296.0;
}

static int64_t rnd_int(int64_t lo, int64_t hi) { /* inclusive */
    return lo + (int64_t)(rnd_u32() % (uint32_t)(hi - lo + 1));
}

static tb_shape shp(tb_dtype dtype, int32_t rank, int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
    tb_shape s;
    int64_t dims[4];
    memset(&s, 0, sizeof s);
    dims[0] = d0;
    dims[1] = d1;
    dims[2] = d2;
    dims[3] = d3;
    assert_int_equal(tb_shape_make(&s, dtype, rank, dims), TB_OK);
    return s;
}

static size_t numel_of(const tb_shape *s) {
    int64_t n = 0;
    assert_int_equal(tb_shape_numel(s, &n), TB_OK);
    return (size_t)n;
}

/* ---- host data ---- */

enum {
    R_ANY,      /* floats in [-2, 2], integers in [-10, 10], u8 in [0, 20] */
    R_POSITIVE, /* floats in [0.1, 3] */
    R_AWAY,     /* |x| in [0.5, 2] */
    R_WHOLE,    /* whole numbers in [-2, 2] (ties for comparisons, argmax) */
    R_INDEX,    /* integers in [0, hi) */
    R_SMALL     /* integers in [0, 4] */
};

static void fill(void *buf, const tb_shape *s, int range, int64_t hi) {
    size_t n = numel_of(s), i;
    for (i = 0; i < n; i++) {
        double f;
        int64_t v;
        switch (range) {
        case R_POSITIVE:
            f = 0.1 + 2.9 * rnd_unit();
            break;
        case R_AWAY:
            f = (0.5 + 1.5 * rnd_unit()) * (rnd_u32() & 1 ? 1 : -1);
            break;
        case R_WHOLE:
            f = (double)rnd_int(-2, 2);
            break;
        default:
            f = -2 + 4 * rnd_unit();
            break;
        }
        if (range == R_INDEX) {
            v = rnd_int(0, hi - 1);
        } else if (range == R_SMALL) {
            v = rnd_int(0, 4);
        } else if (range == R_WHOLE) {
            v = (int64_t)f;
        } else {
            v = s->dtype == TB_U8 ? rnd_int(0, 20) : rnd_int(-10, 10);
        }
        switch (s->dtype) {
        case TB_F32:
            ((float *)buf)[i] = (float)f;
            break;
        case TB_F64:
            ((double *)buf)[i] = f;
            break;
        case TB_I32:
            ((int32_t *)buf)[i] = (int32_t)v;
            break;
        case TB_I64:
            ((int64_t *)buf)[i] = v;
            break;
        case TB_U8:
            ((uint8_t *)buf)[i] = (uint8_t)(v < 0 ? -v : v);
            break;
        default:
            ((uint8_t *)buf)[i] = (uint8_t)(rnd_u32() & 1);
            break;
        }
    }
}

static void *host_alloc(const tb_shape *s) {
    size_t bytes = 0;
    void *p;
    assert_int_equal(tb_shape_nbytes(s, &bytes), TB_OK);
    p = calloc(bytes + 16, 1);
    assert_non_null(p);
    return p;
}

/* ---- comparing a result on both backends ---- */

static double nmse_limit(tb_dtype dtype) {
    return dtype == TB_F64 ? 1e-12 : 1e-7;
}

static double elem(const void *p, tb_dtype dtype, size_t i) {
    switch (dtype) {
    case TB_F32:
        return ((const float *)p)[i];
    case TB_F64:
        return ((const double *)p)[i];
    case TB_I32:
        return ((const int32_t *)p)[i];
    case TB_I64:
        return (double)((const int64_t *)p)[i];
    default:
        return ((const uint8_t *)p)[i];
    }
}

/* Fails the test when got differs from ref: floats by normalised mean squared error (NaN and
   infinities must match where they are), integers and bool exactly. */
static void compare_host(const char *what, const tb_shape *s, const void *ref, const void *got) {
    size_t n = numel_of(s), i, bytes = 0;
    assert_int_equal(tb_shape_nbytes(s, &bytes), TB_OK);
    if (!tb_dtype_is_float(s->dtype)) {
        if (n > 0 && memcmp(ref, got, bytes) != 0) {
            for (i = 0; i < n; i++) {
                if (elem(ref, s->dtype, i) != elem(got, s->dtype, i)) {
                    fail_msg("%s: element %zu is %.17g, expected %.17g", what, i,
                             elem(got, s->dtype, i), elem(ref, s->dtype, i));
                }
            }
        }
        return;
    }
    {
        double num = 0, den = 0, limit = nmse_limit(s->dtype);
        for (i = 0; i < n; i++) {
            double r = elem(ref, s->dtype, i), g = elem(got, s->dtype, i);
            if (r != r || g != g || isinf(r) || isinf(g)) {
                if (!((r != r && g != g) || r == g)) {
                    fail_msg("%s: element %zu is %.9g, expected %.9g", what, i, g, r);
                }
                continue;
            }
            num += (r - g) * (r - g);
            den += r * r;
        }
        if (n > 0 && (den > 0 ? num / den > limit : num > 1e-30)) {
            for (i = 0; i < n && i < 8; i++)
                print_message("  [%zu] got %.9g expected %.9g\n", i, elem(got, s->dtype, i),
                              elem(ref, s->dtype, i));
            fail_msg("%s: normalised mean squared error %.3g (limit %.1g)", what,
                     den > 0 ? num / den : num, limit);
        }
    }
}

static void compare_tensors(const char *what, tb_tensor *ref, tb_tensor *got) {
    tb_shape rs = tb_tensor_shape(ref), gs = tb_tensor_shape(got);
    size_t bytes = 0;
    void *a, *b;
    char t1[64], t2[64];
    tb_shape_format(&rs, t1, sizeof t1);
    tb_shape_format(&gs, t2, sizeof t2);
    if (!tb_shape_equal(&rs, &gs)) fail_msg("%s: shape %s, expected %s", what, t2, t1);
    assert_int_equal(tb_shape_nbytes(&rs, &bytes), TB_OK);
    a = host_alloc(&rs);
    b = host_alloc(&rs);
    if (tb_tensor_to_host(ref, a, bytes) != TB_OK) fail_msg("%s: cpu: %s", what, tb_last_error());
    if (tb_tensor_to_host(got, b, bytes) != TB_OK) {
        fail_msg("%s: opencl: %s", what, tb_last_error());
    }
    compare_host(what, &rs, a, b);
    free(a);
    free(b);
}

/* ---- the names in generated kernels ---- */

/* The naming rule of generated kernels (src/runtime/opencl/opencl.c, "Names in generated kernels"):
   a name of one letter and digits is a numbered name of kind v, i, b, s or x; the arguments b<n>
   and s<n> are declared in the signature only and never assigned; a value or index variable is
   declared at most once in a kernel. A fixed name of a template that took that form could meet a
   numbered one in some graph. */
#define NAME_LIMIT (1 << 17)

static bool is_ident_start(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

static bool is_ident_char(char c) {
    return is_ident_start(c) || (c >= '0' && c <= '9');
}

/* The number of a numbered name (one lowercase letter and digits), else -1. */
static long numbered(const char *tok, size_t len) {
    size_t i;
    long n = 0;
    if (len < 2 || tok[0] < 'a' || tok[0] > 'z') return -1;
    for (i = 1; i < len; i++) {
        if (tok[i] < '0' || tok[i] > '9') return -1;
        n = n * 10 + (tok[i] - '0');
        if (n >= NAME_LIMIT) return NAME_LIMIT - 1;
    }
    return n;
}

static const char *skip_spaces(const char *p) {
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
        p++;
    return p;
}

static void check_kernel_names(const char *what, const char *text) {
    static const char kinds[] = "vibsx";
    unsigned char *declared = (unsigned char *)calloc(5 * (size_t)NAME_LIMIT, 1);
    unsigned char *is_arg = (unsigned char *)calloc(2 * (size_t)NAME_LIMIT, 1);
    const char *k = strstr(text, "__kernel");
    assert_non_null(declared);
    assert_non_null(is_arg);
    while (k != NULL) {
        const char *next = strstr(k + 1, "__kernel");
        const char *end = next != NULL ? next : k + strlen(k);
        const char *body = strstr(k, ") {");
        const char *p = k;
        bool prev_ident = false, prev_comma = false;
        if (body == NULL || body > end) fail_msg("%s: a kernel without a body", what);
        memset(declared, 0, 5 * (size_t)NAME_LIMIT);
        memset(is_arg, 0, 2 * (size_t)NAME_LIMIT);
        while (p < end) {
            const char *tok = p, *after;
            size_t len;
            long num;
            bool decl, assigned, in_body = p > body;
            if (*p >= '0' && *p <= '9') { /* a number, with its suffix or exponent */
                while (p < end && (is_ident_char(*p) || *p == '.'))
                    p++;
                prev_ident = prev_comma = false;
                continue;
            }
            if (!is_ident_start(*p)) {
                if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
                    prev_comma = *p == ',';
                    prev_ident = false;
                }
                p++;
                continue;
            }
            while (p < end && is_ident_char(*p))
                p++;
            len = (size_t)(p - tok);
            num = numbered(tok, len);
            if (num < 0) {
                /* a type before a name declares it; these words do not */
                prev_ident = !((len == 4 && memcmp(tok, "else", 4) == 0) ||
                               (len == 6 && memcmp(tok, "return", 6) == 0));
                prev_comma = false;
                continue;
            }
            after = skip_spaces(p);
            assigned =
                (after[0] == '=' && after[1] != '=') ||
                (strchr("+-*/%&|^", after[0]) != NULL && after[0] != '\0' && after[1] == '=') ||
                (after[0] == '+' && after[1] == '+') || (after[0] == '-' && after[1] == '-');
            decl = prev_ident || (prev_comma && after[0] == '=' && after[1] != '=');
            if (strchr(kinds, tok[0]) == NULL) {
                fail_msg("%s: '%.*s' has the form of a numbered name but no such kind (v, i, b, "
                         "s, x) exists",
                         what, (int)len, tok);
            }
            if (tok[0] == 'b' || tok[0] == 's') {
                unsigned char *arg = &is_arg[(tok[0] == 'b' ? 0 : 1) * (size_t)NAME_LIMIT + num];
                if (!in_body) {
                    if (decl) *arg = 1;
                } else if (decl || assigned) {
                    fail_msg("%s: '%.*s' (an argument's name) is declared or assigned in a kernel "
                             "body:\n%.400s",
                             what, (int)len, tok, tok > body + 200 ? tok - 200 : body);
                } else if (!*arg) {
                    fail_msg("%s: '%.*s' is read but is no argument of its kernel", what, (int)len,
                             tok);
                }
            } else if (decl && in_body && tok[0] != 'x') { /* x<k>: scoped to their op */
                unsigned char *d =
                    &declared[(size_t)(strchr(kinds, tok[0]) - kinds) * NAME_LIMIT + (size_t)num];
                if (*d) fail_msg("%s: '%.*s' is declared twice in a kernel", what, (int)len, tok);
                *d = 1;
            }
            prev_ident = true;
            prev_comma = false;
        }
        k = next;
    }
    free(declared);
    free(is_arg);
}

/* The naming rule on the program a sync of these tensors would run. */
static void check_names_of(const char *what, tb_tensor *const *t, size_t n) {
    char *text = tb_ir_backend_text(t, n);
    if (text == NULL) fail_msg("%s: tb_ir_backend_text: %s", what, tb_last_error());
    check_kernel_names(what, text);
    tb_free(text);
}

/* Cases are built on both devices from the same host data and run in batches: every opencl
   result of a batch is synced at once (one graph, one program), so the suite builds few
   programs. */
#define MAX_IN    6
#define MAX_CASES 400

typedef tb_tensor *(*build_fn)(tb_tensor **in, const void *arg);

typedef struct input {
    tb_shape shape;
    int range;
    int64_t hi;
} input;

typedef struct test_case {
    char name[128];
    tb_tensor *ref, *got;
} test_case;

static test_case g_cases[MAX_CASES];
static size_t g_num_cases;

/* Direct: every result is its own graph output (so each is stored in its own dtype). */
static void flush_cases_direct(void) {
    tb_tensor *got[MAX_CASES], *ref[MAX_CASES];
    size_t i;
    for (i = 0; i < g_num_cases; i++) {
        got[i] = g_cases[i].got;
        ref[i] = g_cases[i].ref;
    }
    if (g_num_cases > 0) {
        check_names_of(g_cases[0].name, got, g_num_cases);
        if (tb_sync(ref, g_num_cases) != TB_OK) fail_msg("cpu sync: %s", tb_last_error());
        if (tb_sync(got, g_num_cases) != TB_OK) fail_msg("opencl sync: %s", tb_last_error());
    }
    for (i = 0; i < g_num_cases; i++) {
        compare_tensors(g_cases[i].name, g_cases[i].ref, g_cases[i].got);
        tb_tensor_release(g_cases[i].ref);
        tb_tensor_release(g_cases[i].got);
    }
    g_num_cases = 0;
}

/* Stacked: every result is cast to f64, flattened and concatenated into one output, so the
   elementwise cases of a batch become one kernel (building a program's kernels is the slow
   part of PoCL); each segment is still compared on its own. */
static tb_tensor *stack_results(bool got) {
    tb_tensor *parts[MAX_CASES], *all;
    size_t i;
    int64_t flat = -1;
    for (i = 0; i < g_num_cases; i++) {
        tb_tensor *c = tb_cast(got ? g_cases[i].got : g_cases[i].ref, TB_F64);
        parts[i] = tb_reshape(c, &flat, 1);
        tb_tensor_release(c);
        if (parts[i] == NULL) fail_msg("%s: stacking: %s", g_cases[i].name, tb_last_error());
    }
    all = tb_concat(parts, g_num_cases, 0);
    for (i = 0; i < g_num_cases; i++)
        tb_tensor_release(parts[i]);
    if (all == NULL) fail_msg("stacking: %s", tb_last_error());
    return all;
}

static void flush_cases(void) {
    tb_tensor *ref, *got;
    tb_shape s;
    double *a, *b;
    size_t i, at = 0, bytes = 0;
    tb_device_info info;
    if (g_num_cases == 0) return;
    if (tb_backend_device_info(&g_ocl, &info) != TB_OK || !info.supports_f64) {
        flush_cases_direct();
        return;
    }
    ref = stack_results(false);
    got = stack_results(true);
    check_names_of(g_cases[0].name, &got, 1);
    s = tb_tensor_shape(ref);
    assert_int_equal(tb_shape_nbytes(&s, &bytes), TB_OK);
    a = (double *)host_alloc(&s);
    b = (double *)host_alloc(&s);
    if (tb_tensor_to_host(ref, a, bytes) != TB_OK) fail_msg("cpu: %s", tb_last_error());
    if (tb_tensor_to_host(got, b, bytes) != TB_OK) fail_msg("opencl: %s", tb_last_error());
    for (i = 0; i < g_num_cases; i++) {
        tb_shape rs = tb_tensor_shape(g_cases[i].ref), gs = tb_tensor_shape(g_cases[i].got);
        size_t n = numel_of(&rs), k;
        if (!tb_shape_equal(&rs, &gs)) fail_msg("%s: the shapes differ", g_cases[i].name);
        if (tb_dtype_is_float(rs.dtype)) {
            double num = 0, den = 0;
            for (k = 0; k < n; k++) {
                double r = a[at + k], g = b[at + k];
                if (r != r || g != g || isinf(r) || isinf(g)) {
                    if (!((r != r && g != g) || r == g))
                        fail_msg("%s: element %zu is %.9g, expected %.9g", g_cases[i].name, k, g,
                                 r);
                    continue;
                }
                num += (r - g) * (r - g);
                den += r * r;
            }
            if (n > 0 && (den > 0 ? num / den > nmse_limit(rs.dtype) : num > 1e-30)) {
                fail_msg("%s: normalised mean squared error %.3g (limit %.1g)", g_cases[i].name,
                         den > 0 ? num / den : num, nmse_limit(rs.dtype));
            }
        } else {
            for (k = 0; k < n; k++) {
                if (a[at + k] != b[at + k]) {
                    fail_msg("%s: element %zu is %.17g, expected %.17g", g_cases[i].name, k,
                             b[at + k], a[at + k]);
                }
            }
        }
        at += n;
        tb_tensor_release(g_cases[i].ref);
        tb_tensor_release(g_cases[i].got);
    }
    free(a);
    free(b);
    tb_tensor_release(ref);
    tb_tensor_release(got);
    g_num_cases = 0;
}

static void add_case(const char *name, build_fn f, const void *arg, const input *ins, size_t nin) {
    tb_tensor *cin[MAX_IN], *oin[MAX_IN];
    void *host[MAX_IN];
    size_t i;
    test_case *c;
    memset(cin, 0, sizeof cin);
    memset(oin, 0, sizeof oin);
    memset(host, 0, sizeof host);
    /* a kernel takes at most 1024 bytes of arguments on some devices: about 120 arrays, so
       a stacked batch reads the inputs of at most 40 cases */
    if (g_num_cases == 40) flush_cases();
    c = &g_cases[g_num_cases];
    snprintf(c->name, sizeof c->name, "%s", name);
    for (i = 0; i < nin; i++) {
        host[i] = host_alloc(&ins[i].shape);
        fill(host[i], &ins[i].shape, ins[i].range, ins[i].hi);
        cin[i] = tb_tensor_from_host(host[i], &ins[i].shape, &g_cpu);
        oin[i] = tb_tensor_from_host(host[i], &ins[i].shape, &g_ocl);
        if (cin[i] == NULL || oin[i] == NULL)
            fail_msg("%s: input %zu: %s", name, i, tb_last_error());
    }
    c->ref = f(cin, arg);
    if (c->ref == NULL) fail_msg("%s: building on cpu: %s", name, tb_last_error());
    c->got = f(oin, arg);
    if (c->got == NULL) fail_msg("%s: building on opencl: %s", name, tb_last_error());
    for (i = 0; i < nin; i++) {
        tb_tensor_release(cin[i]);
        tb_tensor_release(oin[i]);
        free(host[i]);
    }
    g_num_cases++;
}

static input in_of(tb_shape s, int range) {
    input in;
    in.shape = s;
    in.range = range;
    in.hi = 0;
    return in;
}

/* The number of kernels in the program a graph lowers to on opencl:0. */
static int kernel_count(tb_tensor *const *t, size_t n) {
    /* what starts a kernel's entry point in the backend's program */
    const char *mark = TEST_OPENCL ? "__kernel" : "(void *const *tb_a";
    char *text = tb_ir_backend_text(t, n);
    const char *p;
    int count = 0;
    if (text == NULL) fail_msg("tb_ir_backend_text: %s", tb_last_error());
    for (p = strstr(text, mark); p != NULL; p = strstr(p + 1, mark))
        count++;
    tb_free(text);
    return count;
}

/* ---- views applied to an input before an op (the op then reads through index arithmetic) ---- */

enum { V_NONE, V_TRANSPOSE, V_SLICE, V_FLIP, V_EXPAND, V_RESHAPE_PERMUTED, V_COUNT };
static const char *const view_names[V_COUNT] = {"",         "transposed ", "sliced ",
                                                "flipped ", "expanded ",   "permuted+reshaped "};

/* Input shapes for a view so that the result has `out` dims (rank 2: [r, c]). */
static tb_shape view_input_shape(int view, tb_dtype dtype, int64_t r, int64_t c) {
    switch (view) {
    case V_TRANSPOSE:
        return shp(dtype, 2, c, r, 0, 0);
    case V_SLICE:
        return shp(dtype, 2, r, 2 * c + 1, 0, 0);
    case V_EXPAND:
        return shp(dtype, 2, 1, c, 0, 0);
    case V_RESHAPE_PERMUTED:
        return shp(dtype, 2, c, r, 0, 0);
    default:
        return shp(dtype, 2, r, c, 0, 0);
    }
}

static tb_tensor *apply_view(int view, tb_tensor *x, int64_t r, int64_t c) {
    tb_tensor *t, *u;
    switch (view) {
    case V_TRANSPOSE:
        return tb_transpose(x, 0, 1);
    case V_SLICE:
        return tb_slice(x, 1, 1, 2 * c + 1, 2);
    case V_FLIP: {
        int32_t dims[2] = {0, 1};
        return tb_flip(x, dims, 2);
    }
    case V_EXPAND: {
        int64_t d[2];
        d[0] = r;
        d[1] = c;
        return tb_expand(x, d, 2);
    }
    case V_RESHAPE_PERMUTED: {
        /* [c, r] -> transpose [r, c] -> flatten [r*c] -> [r, c]: not expressible as strides */
        int64_t flat = r * c, d[2];
        d[0] = r;
        d[1] = c;
        t = tb_transpose(x, 0, 1);
        u = tb_reshape(t, &flat, 1);
        tb_tensor_release(t);
        t = tb_reshape(u, d, 2);
        tb_tensor_release(u);
        return t;
    }
    default:
        return tb_tensor_retain(x);
    }
}
