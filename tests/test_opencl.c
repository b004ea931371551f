/* The OpenCL backend against the cpu backend: every op, every fusion pattern, seeded random
   graphs, the random streams, two devices, the program cache on disk and the error paths.
   Without an OpenCL device the tests that need one are skipped (the unavailable-library test
   still runs). */
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

/* The backend under test: "opencl" here; tests/test_native.c includes this file for the native
   backend (the same op suite; the tests of OpenCL's own machinery only run for "opencl"). */
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

/* ---- elementwise ops ---- */

typedef struct unary_entry {
    const char *name;
    tb_tensor *(*fn)(tb_tensor *);
    int range;
    bool ints; /* also for integer dtypes */
} unary_entry;

static const unary_entry unary_ops[] = {
    {"neg", tb_neg, R_ANY, true},
    {"abs", tb_abs, R_ANY, true},
    {"exp", tb_exp, R_ANY, false},
    {"log", tb_log, R_POSITIVE, false},
    {"sqrt", tb_sqrt, R_POSITIVE, false},
    {"rsqrt", tb_rsqrt, R_POSITIVE, false},
    {"sin", tb_sin, R_ANY, false},
    {"cos", tb_cos, R_ANY, false},
    {"tanh", tb_tanh, R_ANY, false},
    {"sigmoid", tb_sigmoid, R_ANY, false},
    {"relu", tb_relu, R_ANY, true},
    {"gelu", tb_gelu, R_ANY, false},
    {"silu", tb_silu, R_ANY, false},
    {"reciprocal", tb_reciprocal, R_AWAY, false},
    {"floor", tb_floor, R_ANY, true},
    {"ceil", tb_ceil, R_ANY, true},
    {"round", tb_round, R_ANY, true},
    {"sign", tb_sign, R_WHOLE, true},
    {"erf", tb_erf, R_ANY, false},
#if !defined(TEST_NO_LOG1P_OPS)
    {"softplus", tb_softplus, R_ANY, false},
    {"mish", tb_mish, R_ANY, false},
#endif
};

typedef struct unary_arg {
    const unary_entry *op;
    int view;
    int64_t r, c;
} unary_arg;

static tb_tensor *build_unary(tb_tensor **in, const void *arg) {
    const unary_arg *a = (const unary_arg *)arg;
    tb_tensor *v = apply_view(a->view, in[0], a->r, a->c), *y = a->op->fn(v);
    tb_tensor_release(v);
    return y;
}

static void test_unary(void **state) {
    static unary_arg args[sizeof unary_ops / sizeof unary_ops[0]][6][V_COUNT];
    const tb_dtype dtypes[] = {TB_F32, TB_F64, TB_I32, TB_I64, TB_U8, TB_BOOL};
    size_t i, d;
    int v;
    (void)state;
    REQUIRE_OPENCL();
    for (i = 0; i < sizeof unary_ops / sizeof unary_ops[0]; i++) {
        for (d = 0; d < 6; d++) {
            tb_dtype dt = dtypes[d];
            if (!tb_dtype_is_float(dt) && !unary_ops[i].ints) continue;
            if (dt == TB_BOOL && strcmp(unary_ops[i].name, "sign") != 0) continue;
            if (dt == TB_U8 && strcmp(unary_ops[i].name, "neg") == 0) continue;
            for (v = 0; v < V_COUNT; v++) {
                unary_arg *a = &args[i][d][v];
                char name[128];
                input in;
                if (v != V_NONE && dt != TB_F32) continue;
                a->op = &unary_ops[i];
                a->view = v;
                a->r = 5;
                a->c = 7;
                in = in_of(view_input_shape(v, dt, a->r, a->c), unary_ops[i].range);
                snprintf(name, sizeof name, "%s of %s%s[5,7]", unary_ops[i].name, view_names[v],
                         tb_dtype_name(dt));
                add_case(name, build_unary, a, &in, 1);
            }
        }
    }
    flush_cases();
}

static tb_tensor *build_logical_not(tb_tensor **in, const void *arg) {
    (void)arg;
    return tb_logical_not(in[0]);
}

typedef struct cast_arg {
    tb_dtype to;
} cast_arg;

static tb_tensor *build_cast(tb_tensor **in, const void *arg) {
    return tb_cast(in[0], ((const cast_arg *)arg)->to);
}

static void test_cast_and_not(void **state) {
    static cast_arg casts[6];
    const tb_dtype dtypes[] = {TB_F32, TB_F64, TB_I32, TB_I64, TB_U8, TB_BOOL};
    size_t from, to;
    (void)state;
    REQUIRE_OPENCL();
    for (to = 0; to < 6; to++)
        casts[to].to = dtypes[to];
    for (from = 0; from < 6; from++) {
        input in = in_of(shp(dtypes[from], 2, 3, 11, 0, 0), R_ANY);
        char name[96];
        for (to = 0; to < 6; to++) {
            snprintf(name, sizeof name, "cast %s -> %s", tb_dtype_name(dtypes[from]),
                     tb_dtype_name(dtypes[to]));
            add_case(name, build_cast, &casts[to], &in, 1);
        }
        snprintf(name, sizeof name, "logical_not of %s", tb_dtype_name(dtypes[from]));
        add_case(name, build_logical_not, NULL, &in, 1);
    }
    flush_cases();
    /* each dtype stored directly as a kernel's output */
    for (to = 0; to < 6; to++) {
        input in = in_of(shp(dtypes[(to + 1) % 6], 2, 3, 11, 0, 0), R_ANY);
        char name[96];
        snprintf(name, sizeof name, "cast %s -> %s (stored)", tb_dtype_name(dtypes[(to + 1) % 6]),
                 tb_dtype_name(dtypes[to]));
        add_case(name, build_cast, &casts[to], &in, 1);
    }
    flush_cases_direct();
    /* float to integer: truncation toward zero, wrapping into u8 and i32 */
    {
        input in = in_of(shp(TB_F32, 1, 64, 0, 0, 0), R_ANY);
        add_case("cast f32 -> u8 (negative values wrap)", build_cast, &casts[4], &in, 1);
    }
    flush_cases();
}

typedef struct binary_entry {
    const char *name;
    tb_tensor *(*fn)(tb_tensor *, tb_tensor *);
    int range_a, range_b;
    unsigned dtypes; /* bit per tb_dtype */
} binary_entry;

#define ALL_DT   0x3fu
#define NUM_DT   0x1fu /* not bool */
#define FLOAT_DT 0x03u
#define BOOL_DT  0x20u

static const binary_entry binary_ops[] = {
    {"add", tb_add, R_ANY, R_ANY, ALL_DT},
    {"sub", tb_sub, R_ANY, R_ANY, NUM_DT},
    {"mul", tb_mul, R_ANY, R_ANY, ALL_DT},
    {"div", tb_div, R_ANY, R_AWAY, FLOAT_DT},
    {"pow", tb_pow, R_POSITIVE, R_ANY, FLOAT_DT},
    {"pow", tb_pow, R_ANY, R_SMALL, 0x1cu},
    {"maximum", tb_maximum, R_WHOLE, R_WHOLE, ALL_DT},
    {"minimum", tb_minimum, R_WHOLE, R_WHOLE, ALL_DT},
    {"eq", tb_eq, R_WHOLE, R_WHOLE, ALL_DT},
    {"ne", tb_ne, R_WHOLE, R_WHOLE, ALL_DT},
    {"lt", tb_lt, R_WHOLE, R_WHOLE, ALL_DT},
    {"le", tb_le, R_WHOLE, R_WHOLE, ALL_DT},
    {"gt", tb_gt, R_WHOLE, R_WHOLE, ALL_DT},
    {"ge", tb_ge, R_WHOLE, R_WHOLE, ALL_DT},
    {"logical_and", tb_logical_and, R_ANY, R_ANY, BOOL_DT},
    {"logical_or", tb_logical_or, R_ANY, R_ANY, BOOL_DT},
};

static tb_tensor *build_binary(tb_tensor **in, const void *arg) {
    return ((const binary_entry *)arg)->fn(in[0], in[1]);
}

static void test_binary(void **state) {
    /* broadcasting pairs: same, trailing vector, both sides, scalar-like, size 1 */
    static const int64_t pairs[][2][4] = {
        {{3, 4, 0, 0}, {3, 4, 0, 0}}, {{3, 4, 0, 0}, {4, 0, 0, 0}}, {{2, 1, 5, 0}, {3, 1, 0, 0}},
        {{1, 0, 0, 0}, {2, 3, 0, 0}}, {{4, 1, 0, 0}, {1, 5, 0, 0}}, {{1, 1, 1, 0}, {1, 1, 1, 0}},
    };
    static const int32_t ranks[][2] = {{2, 2}, {2, 1}, {3, 2}, {1, 2}, {2, 2}, {3, 3}};
    const tb_dtype dtypes[] = {TB_F32, TB_F64, TB_I32, TB_I64, TB_U8, TB_BOOL};
    size_t i, d, p;
    (void)state;
    REQUIRE_OPENCL();
    for (i = 0; i < sizeof binary_ops / sizeof binary_ops[0]; i++) {
        for (d = 0; d < 6; d++) {
            if (!((binary_ops[i].dtypes >> d) & 1u)) continue;
            for (p = 0; p < sizeof pairs / sizeof pairs[0]; p++) {
                input in[2];
                char name[128];
                if (d != 0 && p != 1 && p != 2) continue;
                in[0] = in_of(
                    shp(dtypes[d], ranks[p][0], pairs[p][0][0], pairs[p][0][1], pairs[p][0][2], 0),
                    binary_ops[i].range_a);
                in[1] = in_of(
                    shp(dtypes[d], ranks[p][1], pairs[p][1][0], pairs[p][1][1], pairs[p][1][2], 0),
                    binary_ops[i].range_b);
                snprintf(name, sizeof name, "%s %s shapes #%zu", binary_ops[i].name,
                         tb_dtype_name(dtypes[d]), p);
                add_case(name, build_binary, &binary_ops[i], in, 2);
            }
        }
    }
    flush_cases();
}

typedef struct scalar_entry {
    const char *name;
    tb_tensor *(*fn)(tb_tensor *, double);
    double value;
} scalar_entry;

static const scalar_entry scalar_ops[] = {
    {"add_scalar", tb_add_scalar, 2.5}, {"sub_scalar", tb_sub_scalar, -1.25},
    {"mul_scalar", tb_mul_scalar, 3.0}, {"div_scalar", tb_div_scalar, 0.75},
    {"pow_scalar", tb_pow_scalar, 2.0}, {"pow_scalar", tb_pow_scalar, 0.5},
};

static tb_tensor *build_scalar_op(tb_tensor **in, const void *arg) {
    const scalar_entry *e = (const scalar_entry *)arg;
    return e->fn(in[0], e->value);
}

typedef struct ternary_arg {
    int which; /* 0 where, 1 clamp */
    double lo, hi;
} ternary_arg;

static tb_tensor *build_ternary(tb_tensor **in, const void *arg) {
    const ternary_arg *a = (const ternary_arg *)arg;
    if (a->which == 0) {
        tb_tensor *cond = tb_gt(in[0], in[1]), *y = tb_where(cond, in[1], in[2]);
        tb_tensor_release(cond);
        return y;
    }
    return tb_clamp(in[0], a->lo, a->hi);
}

static void test_scalar_operands_and_ternary(void **state) {
    static const ternary_arg where_arg = {0, 0, 0}, clamp_arg = {1, -0.5, 1.25},
                             clamp_swapped = {1, 1.0, -1.0}, clamp_int = {1, -3, 4};
    const tb_dtype dtypes[] = {TB_F32, TB_F64, TB_I32, TB_I64, TB_U8};
    size_t i, d;
    input in[3];
    (void)state;
    REQUIRE_OPENCL();
    for (i = 0; i < sizeof scalar_ops / sizeof scalar_ops[0]; i++) {
        for (d = 0; d < 5; d++) {
            char name[96];
            if (scalar_ops[i].fn == tb_pow_scalar && d >= 2) continue;
            if (scalar_ops[i].fn == tb_div_scalar && d >= 2) continue;
            in[0] = in_of(shp(dtypes[d], 2, 4, 6, 0, 0),
                          scalar_ops[i].fn == tb_pow_scalar ? R_POSITIVE : R_ANY);
            snprintf(name, sizeof name, "%s %g on %s", scalar_ops[i].name, scalar_ops[i].value,
                     tb_dtype_name(dtypes[d]));
            add_case(name, build_scalar_op, &scalar_ops[i], in, 1);
        }
    }
    for (d = 0; d < 5; d++) {
        in[0] = in_of(shp(dtypes[d], 2, 3, 5, 0, 0), R_WHOLE);
        in[1] = in_of(shp(dtypes[d], 1, 5, 0, 0, 0), R_WHOLE);
        in[2] = in_of(shp(dtypes[d], 3, 2, 1, 5, 0), R_ANY);
        add_case("where with broadcasting", build_ternary, &where_arg, in, 3);
        in[0] = in_of(shp(dtypes[d], 2, 3, 5, 0, 0), R_ANY);
        add_case("clamp", build_ternary, d < 2 ? &clamp_arg : &clamp_int, in, 1);
        if (d < 2) add_case("clamp with lo > hi", build_ternary, &clamp_swapped, in, 1);
    }
    flush_cases();
}

/* ---- reductions ---- */

typedef struct reduce_arg {
    int which; /* 0 sum 1 mean 2 max 3 min 4 prod 5 argmax 6 argmin */
    int32_t axes[4];
    size_t num_axes;
    bool keepdim;
    bool prologue; /* reduce exp(x) * 0.5 rather than x */
} reduce_arg;

static tb_tensor *build_reduce(tb_tensor **in, const void *arg) {
    const reduce_arg *a = (const reduce_arg *)arg;
    tb_tensor *x = tb_tensor_retain(in[0]), *y = NULL;
    if (a->prologue) {
        tb_tensor *e = tb_exp(x);
        tb_tensor_release(x);
        x = tb_mul_scalar(e, 0.5);
        tb_tensor_release(e);
    }
    switch (a->which) {
    case 0:
        y = tb_sum(x, a->axes, a->num_axes, a->keepdim);
        break;
    case 1:
        y = tb_mean(x, a->axes, a->num_axes, a->keepdim);
        break;
    case 2:
        y = tb_max(x, a->axes, a->num_axes, a->keepdim);
        break;
    case 3:
        y = tb_min(x, a->axes, a->num_axes, a->keepdim);
        break;
    case 4:
        y = tb_prod(x, a->axes, a->num_axes, a->keepdim);
        break;
    case 5:
        y = tb_argmax(x, a->axes[0], a->keepdim);
        break;
    default:
        y = tb_argmin(x, a->axes[0], a->keepdim);
        break;
    }
    tb_tensor_release(x);
    return y;
}

static void test_reductions(void **state) {
    static reduce_arg args[1024];
    static const int32_t axis_sets[][3] = {{0, 0, 0}, {1, 0, 0}, {2, 0, 0}, {0, 2, 0},
                                           {1, 2, 0}, {0, 1, 2}, {-1, 0, 0}};
    static const size_t axis_counts[] = {1, 1, 1, 2, 2, 3, 1};
    static const char *const names[] = {"sum", "mean", "max", "min", "prod", "argmax", "argmin"};
    const tb_dtype dtypes[] = {TB_F32, TB_F64, TB_I32, TB_I64, TB_U8, TB_BOOL};
    size_t n = 0, s, d;
    int which, keep;
    (void)state;
    REQUIRE_OPENCL();
    for (which = 0; which < 7; which++) {
        for (d = 0; d < 6; d++) {
            tb_dtype dt = dtypes[d];
            if (which == 1 && !tb_dtype_is_float(dt)) continue;
            if ((which == 0 || which == 4 || which >= 5) && dt == TB_BOOL) continue;
            for (s = 0; s < sizeof axis_counts / sizeof axis_counts[0]; s++) {
                for (keep = 0; keep < 2; keep++) {
                    reduce_arg *a = &args[n++];
                    input in;
                    char name[128];
                    if (which >= 5 && axis_counts[s] != 1) continue;
                    /* every axis set for f32 (keepdim on two of them), one per other dtype */
                    if (keep && (d != 0 || s != 4)) continue;
                    if (d == 0 && which < 5 && s != 1 && s != 3 && s != 5 && s != 6) continue;
                    if (d == 0 && which >= 5 && s != 0 && s != 6) continue;
                    if (d != 0) {
                        size_t pick = (size_t)(which + (int)d) % 7;
                        if (which >= 5 && axis_counts[pick] != 1)
                            pick = (size_t)(which + (int)d) % 3;
                        if (s != pick) continue;
                    }
                    a->which = which;
                    memcpy(a->axes, axis_sets[s], sizeof axis_sets[s]);
                    a->num_axes = axis_counts[s];
                    a->keepdim = keep != 0;
                    a->prologue = false;
                    in = in_of(shp(dt, 3, 3, 5, 7, 0), which >= 2 && which != 4 ? R_WHOLE : R_ANY);
                    snprintf(name, sizeof name, "%s of %s[3,5,7] over %zu axes (set %zu)%s",
                             names[which], tb_dtype_name(dt), axis_counts[s], s,
                             keep ? " keepdim" : "");
                    add_case(name, build_reduce, a, &in, 1);
                }
            }
        }
        flush_cases();
    }
    /* all axes, long rows (work-group reductions), an elementwise prologue, size-1 axes */
    {
        /* long rows, long columns, many rows; then rows so long the reduction is split into
           chunks reduced in parallel and combined */
        /* and ranges long enough per work item that each vector accumulator of CPU devices
           reads its own part (rows of 40003; chunks of a split over 4200007) */
        static const int64_t sizes[][3] = {{1, 5000, 1},   {5000, 3, 0},  {64, 700, 1},
                                           {2, 40000, 1},  {50000, 1, 0}, {16, 40003, 1},
                                           {1, 4200007, 1}};
        size_t k;
        for (k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
            if (g_small && sizes[k][0] * sizes[k][1] > 50000) continue;
            for (which = 0; which < 7; which++) {
                reduce_arg *a;
                input in = in_of(shp(TB_F32, 2, sizes[k][0], sizes[k][1], 0, 0), R_ANY);
                if (which == 3 || which == 4 || which == 6) continue; /* as max, sum, argmax */
                a = &args[n++];
                char name[128];
                a->which = which;
                a->axes[0] = (int32_t)sizes[k][2];
                a->num_axes = which == 0 && k == 1 ? 0 : 1; /* 0: every axis */
                a->keepdim = false;
                a->prologue = which < 5;
                if (which == 4) in.range = R_POSITIVE;
                snprintf(name, sizeof name, "%s over [%lld,%lld] axis %d%s", names[which],
                         (long long)sizes[k][0], (long long)sizes[k][1], (int)a->axes[0],
                         a->prologue ? " of exp(x)*0.5" : "");
                add_case(name, build_reduce, a, &in, 1);
            }
        }
        flush_cases();
    }
    /* every dtype over rows and columns whose length is not a multiple of the accumulator
       lanes of CPU devices (the remainder loop), plain and split into chunks */
    {
        static const int64_t sizes[][3] = {{7, 1003, 1}, {1003, 7, 0}, {1, 70001, 1}};
        const tb_dtype more[] = {TB_F64, TB_I32, TB_I64, TB_U8};
        size_t k;
        for (k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
            if (g_small && sizes[k][0] * sizes[k][1] > 50000) continue;
            for (d = 0; d < sizeof more / sizeof more[0]; d++) {
                for (which = 0; which < 5; which++) {
                    reduce_arg *a;
                    input in;
                    char name[128];
                    if (which == 1 && !tb_dtype_is_float(more[d])) continue;
                    /* a float product of 70001 factors overflows in any order */
                    if (which == 4 && k == 2 && tb_dtype_is_float(more[d])) continue;
                    assert_true(n < sizeof args / sizeof args[0]);
                    in = in_of(shp(more[d], 2, sizes[k][0], sizes[k][1], 0, 0),
                               which == 4 ? R_POSITIVE : R_ANY);
                    a = &args[n++];
                    a->which = which;
                    a->axes[0] = (int32_t)sizes[k][2];
                    a->num_axes = 1;
                    a->keepdim = false;
                    a->prologue = false;
                    snprintf(name, sizeof name, "%s of %s[%lld,%lld] axis %d", names[which],
                             tb_dtype_name(more[d]), (long long)sizes[k][0], (long long)sizes[k][1],
                             (int)a->axes[0]);
                    add_case(name, build_reduce, a, &in, 1);
                }
            }
            flush_cases();
        }
    }
}

static void test_argmax_nan_and_ties(void **state) {
    float x[12] = {1, 3, 3, 0, NAN, 2, NAN, 5, -1, -1, -1, -1};
    tb_shape s = shp(TB_F32, 2, 3, 4, 0, 0);
    tb_tensor *cx, *ox, *ca, *oa, *cm, *om;
    (void)state;
    REQUIRE_OPENCL();
    cx = tb_tensor_from_host(x, &s, &g_cpu);
    ox = tb_tensor_from_host(x, &s, &g_ocl);
    ca = tb_argmax(cx, 1, false);
    oa = tb_argmax(ox, 1, false);
    cm = tb_max(cx, NULL, 0, false);
    om = tb_max(ox, NULL, 0, false);
    compare_tensors("argmax with NaN and ties", ca, oa);
    compare_tensors("max with NaN", cm, om);
    {
        int64_t idx[3];
        assert_int_equal(tb_tensor_to_host(oa, idx, sizeof idx), TB_OK);
        assert_int_equal(idx[0], 1); /* first of the tied maxima */
        assert_int_equal(idx[1], 0); /* NaN counts as the maximum */
        assert_int_equal(idx[2], 0);
    }
    tb_tensor_release(cx);
    tb_tensor_release(ox);
    tb_tensor_release(ca);
    tb_tensor_release(oa);
    tb_tensor_release(cm);
    tb_tensor_release(om);
}

/* ---- matmul, softmax, layer_norm ---- */

typedef struct mm_arg {
    int epilogue;     /* 0 none, 1 + bias, 2 relu(+ bias), 3 * 2 then gelu, 4 detached,
                         5 reshaped flat */
    bool transpose_b; /* b given as [n, k] and transposed (a view) */
    bool prologue;    /* a is exp(a) * 0.5 */
    bool transpose_a; /* a given as [k, m] and transposed (a view) */
} mm_arg;

static tb_tensor *build_matmul(tb_tensor **in, const void *arg) {
    const mm_arg *a = (const mm_arg *)arg;
    tb_tensor *b = a->transpose_b ? tb_transpose(in[1], -1, -2) : tb_tensor_retain(in[1]);
    tb_tensor *x = a->transpose_a ? tb_transpose(in[0], -1, -2) : tb_tensor_retain(in[0]), *y, *t;
    if (a->prologue) {
        t = tb_exp(x);
        tb_tensor_release(x);
        x = tb_mul_scalar(t, 0.5);
        tb_tensor_release(t);
    }
    y = tb_matmul(x, b);
    tb_tensor_release(x);
    tb_tensor_release(b);
    if (a->epilogue >= 1 && a->epilogue <= 2) {
        t = tb_add(y, in[2]);
        tb_tensor_release(y);
        y = t;
    }
    if (a->epilogue == 2) {
        t = tb_relu(y);
        tb_tensor_release(y);
        y = t;
    }
    if (a->epilogue == 3) {
        t = tb_mul_scalar(y, 2.0);
        tb_tensor_release(y);
        y = tb_gelu(t);
        tb_tensor_release(t);
    }
    if (a->epilogue == 4 || a->epilogue == 5) { /* a reshape to its own dims, or flat */
        tb_shape ys = tb_tensor_shape(y);
        int64_t n = 1;
        int32_t d;
        for (d = 0; d < ys.rank; d++)
            n *= ys.dims[d];
        t = a->epilogue == 4 ? tb_detach(y) : tb_reshape(y, &n, 1);
        tb_tensor_release(y);
        y = t;
    }
    return y;
}

static void test_matmul(void **state) {
    static const mm_arg plain = {0, false, false, false}, bias = {1, false, false, false},
                        relu_bias = {2, false, false, false},
                        scaled_gelu = {3, false, false, false},
                        transposed = {0, true, false, false},
                        transposed_bias = {2, true, false, false};
    input in[3];
    const tb_dtype dtypes[] = {TB_F32, TB_F64, TB_I32, TB_I64, TB_U8};
    size_t d;
    (void)state;
    REQUIRE_OPENCL();
    for (d = 0; d < 5; d++) {
        tb_dtype dt = dtypes[d];
        if (dt == TB_I64 || dt == TB_U8) continue; /* integer accumulation: as i32 */
        in[0] = in_of(shp(dt, 2, 5, 7, 0, 0), R_ANY);
        in[1] = in_of(shp(dt, 2, 7, 3, 0, 0), R_ANY);
        add_case("matmul [5,7]x[7,3]", build_matmul, &plain, in, 2);
    }
    in[0] = in_of(shp(TB_F32, 2, 70, 33, 0, 0), R_ANY);
    in[1] = in_of(shp(TB_F32, 2, 33, 90, 0, 0), R_ANY);
    in[2] = in_of(shp(TB_F32, 1, 90, 0, 0, 0), R_ANY);
    add_case("relu(matmul [70,33]x[33,90] + bias)", build_matmul, &relu_bias, in, 3);
    add_case("gelu(matmul * 2)", build_matmul, &scaled_gelu, in, 2);
    in[1] = in_of(shp(TB_F32, 2, 90, 33, 0, 0), R_ANY);
    add_case("relu(matmul(a, b^T) + bias)", build_matmul, &transposed_bias, in, 3);
    (void)bias, (void)transposed;
    /* batched, broadcast batch, 1-D cases, empty k */
    in[0] = in_of(shp(TB_F32, 3, 4, 6, 5, 0), R_ANY);
    in[1] = in_of(shp(TB_F32, 3, 4, 5, 7, 0), R_ANY);
    add_case("batched matmul", build_matmul, &plain, in, 2);
    in[1] = in_of(shp(TB_F32, 2, 5, 7, 0, 0), R_ANY);
    add_case("matmul broadcasting b over the batch", build_matmul, &plain, in, 2);
    in[0] = in_of(shp(TB_F32, 4, 2, 1, 3, 5), R_ANY);
    in[1] = in_of(shp(TB_F32, 3, 4, 5, 2, 0), R_ANY);
    add_case("matmul broadcasting both batches", build_matmul, &plain, in, 2);
    in[0] = in_of(shp(TB_F32, 1, 9, 0, 0, 0), R_ANY);
    in[1] = in_of(shp(TB_F32, 1, 9, 0, 0, 0), R_ANY);
    add_case("dot product", build_matmul, &plain, in, 2);
    in[1] = in_of(shp(TB_F32, 2, 9, 4, 0, 0), R_ANY);
    add_case("vector x matrix", build_matmul, &plain, in, 2);
    in[0] = in_of(shp(TB_F32, 2, 4, 9, 0, 0), R_ANY);
    in[1] = in_of(shp(TB_F32, 1, 9, 0, 0, 0), R_ANY);
    add_case("matrix x vector", build_matmul, &plain, in, 2);
    in[0] = in_of(shp(TB_F32, 2, 3, 0, 0, 0), R_ANY);
    in[1] = in_of(shp(TB_F32, 2, 0, 4, 0, 0), R_ANY);
    add_case("matmul with k = 0", build_matmul, &plain, in, 2);
    /* small N (a classifier's last layer): native adds one vector of B's row per step */
    in[0] = in_of(shp(TB_F32, 2, 41, 64, 0, 0), R_ANY);
    in[1] = in_of(shp(TB_F32, 2, 64, 10, 0, 0), R_ANY);
    in[2] = in_of(shp(TB_F32, 1, 10, 0, 0, 0), R_ANY);
    add_case("relu(matmul [41,64]x[64,10] + bias)", build_matmul, &relu_bias, in, 3);
    in[1] = in_of(shp(TB_F32, 2, 64, 2, 0, 0), R_ANY);
    add_case("matmul [41,64]x[64,2]", build_matmul, &plain, in, 2);
    flush_cases();
    /* big enough for CPU devices to copy the operands into panels first: sizes that are not
       multiples of the panel widths, both float types, views and producers in the panels */
    {
        static const mm_arg exp_a = {0, false, true, false};
        for (d = 0; d < 2; d++) {
            tb_dtype dt = dtypes[d];
            in[0] = in_of(shp(dt, 2, 100, 70, 0, 0), R_ANY);
            in[1] = in_of(shp(dt, 2, 70, 90, 0, 0), R_ANY);
            in[2] = in_of(shp(dt, 1, 90, 0, 0, 0), R_ANY);
            add_case("relu(matmul [100,70]x[70,90] + bias)", build_matmul, &relu_bias, in, 3);
            add_case("matmul(exp(a) * 0.5, b)", build_matmul, &exp_a, in, 2);
            in[1] = in_of(shp(dt, 2, 90, 70, 0, 0), R_ANY);
            add_case("relu(matmul(a, b^T) + bias) [100,70]x[70,90]", build_matmul, &transposed_bias,
                     in, 3);
        }
        in[0] = in_of(shp(TB_F32, 3, 3, 70, 61, 0), R_ANY);
        in[1] = in_of(shp(TB_F32, 3, 3, 61, 83, 0), R_ANY);
        add_case("batched matmul [3,70,61]x[3,61,83]", build_matmul, &plain, in, 2);
        /* A computed in the graph with rows that fill whole panels: read in place, both
           operands broadcast over a two-dimensional batch */
        in[0] = in_of(shp(TB_F32, 4, 2, 1, 64, 61), R_ANY);
        in[1] = in_of(shp(TB_F32, 4, 1, 3, 61, 83), R_ANY);
        add_case("matmul(exp(a) * 0.5, b) [2,1,64,61]x[1,3,61,83] (both broadcast)", build_matmul,
                 &exp_a, in, 2);
        in[0] = in_of(shp(TB_F32, 3, 3, 70, 61, 0), R_ANY);
        in[1] = in_of(shp(TB_F32, 2, 61, 83, 0, 0), R_ANY);
        add_case("matmul [3,70,61]x[61,83] (b broadcast)", build_matmul, &scaled_gelu, in, 2);
        in[0] = in_of(shp(TB_F32, 2, 256, 256, 0, 0), R_ANY);
        in[1] = in_of(shp(TB_F32, 2, 256, 256, 0, 0), R_ANY);
        if (!g_small) add_case("matmul [256,256]x[256,256]", build_matmul, &plain, in, 2);
        /* B larger than a core's caches (megabytes): the work items go over the output in
           groups of column panels, the last group narrower; a long K: groups of one panel */
        for (d = 0; d < (g_small ? 0u : 2u); d++) {
            in[0] = in_of(shp(dtypes[d], 2, 37, 1100, 0, 0), R_ANY);
            in[1] = in_of(shp(dtypes[d], 2, 1100, 500, 0, 0), R_ANY);
            in[2] = in_of(shp(dtypes[d], 1, 500, 0, 0, 0), R_ANY);
            add_case("relu(matmul [37,1100]x[1100,500] + bias)", build_matmul, &relu_bias, in, 3);
        }
        in[0] = in_of(shp(TB_F32, 3, 2, 20, 1100, 0), R_ANY);
        in[1] = in_of(shp(TB_F32, 3, 2, 1100, 500, 0), R_ANY);
        if (!g_small)
            add_case("batched matmul [2,20,1100]x[2,1100,500]", build_matmul, &plain, in, 2);
        in[0] = in_of(shp(TB_F32, 2, 5, 40000, 0, 0), R_ANY);
        in[1] = in_of(shp(TB_F32, 2, 40000, 33, 0, 0), R_ANY);
        if (!g_small) add_case("matmul [5,40000]x[40000,33]", build_matmul, &plain, in, 2);
        /* the matmul under a reshape: its kernel stores through it (to its own dims: a
           detached gradient; flat) */
        {
            static const mm_arg detached = {4, false, false, false},
                                flat = {5, false, false, false},
                                detached_t = {4, true, false, true},
                                flat_t = {5, true, false, true};
            in[0] = in_of(shp(TB_F32, 2, 100, 70, 0, 0), R_ANY);
            in[1] = in_of(shp(TB_F32, 2, 70, 90, 0, 0), R_ANY);
            add_case("detach(matmul [100,70]x[70,90])", build_matmul, &detached, in, 2);
            add_case("reshape(matmul [100,70]x[70,90], [9000])", build_matmul, &flat, in, 2);
            in[0] = in_of(shp(TB_F32, 2, 70, 100, 0, 0), R_ANY);
            in[1] = in_of(shp(TB_F32, 2, 90, 70, 0, 0), R_ANY);
            add_case("detach(matmul(a^T, b^T))", build_matmul, &detached_t, in, 2);
            add_case("reshape(matmul(a^T, b^T), [9000])", build_matmul, &flat_t, in, 2);
        }
        flush_cases();
    }
}

/* A matmul of a transposed operand whose result is only detached (a gradient as tb_grad
   returns it): the matmul's kernel stores through the reshape. Against the cpu backend. */
static void test_matmul_through_reshape(void **state) {
    static float a[256 * 300], b[256 * 130];
    float got[300 * 130], want[300 * 130];
    tb_shape sa = shp(TB_F32, 2, 256, 300, 0, 0), sb = shp(TB_F32, 2, 256, 130, 0, 0);
    const tb_device *devs[2];
    int k;
    size_t i;
    (void)state;
    REQUIRE_OPENCL();
    devs[0] = &g_ocl;
    devs[1] = &g_cpu;
    fill(a, &sa, R_ANY, 1);
    fill(b, &sb, R_ANY, 2);
    for (k = 0; k < 2; k++) {
        tb_tensor *x = tb_tensor_from_host(a, &sa, devs[k]);
        tb_tensor *y = tb_tensor_from_host(b, &sb, devs[k]);
        tb_tensor *xt = tb_transpose(x, 0, 1), *m = tb_matmul(xt, y), *r = tb_detach(m);
        assert_non_null(r);
        assert_int_equal(tb_tensor_to_host(r, k == 0 ? got : want, sizeof got), TB_OK);
        tb_tensor_release(r);
        tb_tensor_release(m);
        tb_tensor_release(xt);
        tb_tensor_release(y);
        tb_tensor_release(x);
    }
    for (i = 0; i < 300 * 130; i++)
        assert_true(fabsf(got[i] - want[i]) <= 1e-3f * (1.0f + fabsf(want[i])));
}

/* A packed f32 matmul's epilogue runs W columns at once where each block row is whole
   vectors: bias, gelu, exp (a call that kept the scalar loop from vectorising), seen through
   a reshape that keeps the last axis ([90, 64] as [6, 15, 64]), with an edge block (rows
   80..95 of 90 with 16-row blocks) stored as scalars; values as cpu's. */
static void test_matmul_vector_epilogue(void **state) {
    enum { M = 90, K = 72, N = 64 };
    static float a[M * K], b[K * N], c[N], got[M * N], want[M * N];
    tb_shape sa = shp(TB_F32, 2, M, K, 0, 0), sb = shp(TB_F32, 2, K, N, 0, 0);
    tb_shape sc = shp(TB_F32, 1, N, 0, 0, 0);
    const int64_t three[3] = {6, M / 6, N};
    const tb_device *devs[2];
    int k;
    size_t i;
    (void)state;
    REQUIRE_OPENCL();
    devs[0] = &g_ocl;
    devs[1] = &g_cpu;
    fill(a, &sa, R_ANY, 5);
    fill(b, &sb, R_ANY, 6);
    fill(c, &sc, R_ANY, 7);
    for (k = 0; k < 2; k++) {
        tb_tensor *x = tb_tensor_from_host(a, &sa, devs[k]);
        tb_tensor *w = tb_tensor_from_host(b, &sb, devs[k]);
        tb_tensor *bias = tb_tensor_from_host(c, &sc, devs[k]);
        tb_tensor *m = tb_matmul(x, w), *r = tb_reshape(m, three, 3), *h = tb_add(r, bias);
        tb_tensor *gl = tb_gelu(h), *hs = tb_mul_scalar(gl, -0.5), *y = tb_exp(hs);
        assert_non_null(y);
        if (k == 0) {
            char *text = tb_ir_backend_text(&y, 1);
            assert_non_null(text);
            assert_non_null(strstr(text, "PB_"));
            assert_non_null(strstr(text, "= TB_VLD(0, acc[ii]);"));
            tb_free(text);
        }
        assert_int_equal(tb_tensor_to_host(y, k == 0 ? got : want, sizeof got), TB_OK);
        tb_tensor_release(y);
        tb_tensor_release(hs);
        tb_tensor_release(gl);
        tb_tensor_release(h);
        tb_tensor_release(r);
        tb_tensor_release(m);
        tb_tensor_release(bias);
        tb_tensor_release(w);
        tb_tensor_release(x);
    }
    for (i = 0; i < M * N; i++)
        if (!(fabsf(got[i] - want[i]) <= 1e-4f * (1.0f + fabsf(want[i]))))
            fail_msg("element %zu: %.9g, cpu's %.9g", i, (double)got[i], (double)want[i]);
}

/* An elementwise kernel over rows the vectors cannot take (a last axis of 28): on the native
   backend a work item runs a row, its leading dims' positions once per row; values as cpu's
   with a transposed and a row-broadcast operand, a max-pool-like gather and a select. */
static void test_elementwise_rows(void **state) {
    static float a[6 * 32 * 28], c[6 * 32 * 14];
    float got[6 * 32 * 28], want[6 * 32 * 28];
    tb_shape sa = shp(TB_F32, 3, 6, 32, 28, 0), sc = shp(TB_F32, 3, 6, 32, 14, 0);
    const tb_device *devs[2];
    int k;
    size_t i;
    (void)state;
    REQUIRE_OPENCL();
    devs[0] = &g_ocl;
    devs[1] = &g_cpu;
    fill(a, &sa, R_ANY, 3);
    fill(c, &sc, R_ANY, 4);
    for (k = 0; k < 2; k++) {
        const int64_t up[4] = {6, 32, 14, 2}, flat[3] = {6, 32, 28};
        tb_tensor *x = tb_tensor_from_host(a, &sa, devs[k]);
        tb_tensor *p = tb_tensor_from_host(c, &sc, devs[k]);
        tb_tensor *pu = tb_unsqueeze(p, 3), *pe = tb_expand(pu, up, 4);
        tb_tensor *pr = tb_reshape(pe, flat, 3); /* each pooled value twice along the row */
        tb_tensor *xt = tb_transpose(x, 0, 1), *xb = tb_transpose(xt, 0, 1);
        tb_tensor *z = tb_zeros(&sa, devs[k]), *pos = tb_gt(xb, z), *m = tb_mul(pr, xb);
        tb_tensor *y = tb_where(pos, m, z);
        char *text;
        assert_non_null(y);
        if (k == 0 && strcmp(TEST_BACKEND, "native") == 0) {
            text = tb_ir_backend_text(&y, 1);
            assert_non_null(text);
            if (strstr(text, "< 28L; i") == NULL) fail_msg("no row loop in:\n%s", text);
            tb_free(text);
        }
        assert_int_equal(tb_tensor_to_host(y, k == 0 ? got : want, sizeof got), TB_OK);
        tb_tensor_release(y);
        tb_tensor_release(z);
        tb_tensor_release(m);
        tb_tensor_release(pos);
        tb_tensor_release(xb);
        tb_tensor_release(xt);
        tb_tensor_release(pr);
        tb_tensor_release(pe);
        tb_tensor_release(pu);
        tb_tensor_release(p);
        tb_tensor_release(x);
    }
    for (i = 0; i < 6 * 32 * 28; i++)
        if (got[i] != want[i])
            fail_msg("element %zu: %g, cpu %g", i, (double)got[i], (double)want[i]);
}

typedef struct norm_arg {
    int which; /* 0 softmax, 1 log_softmax, 2 layer_norm */
    int32_t axis;
    bool weight, bias, prologue, epilogue;
} norm_arg;

static tb_tensor *build_norm(tb_tensor **in, const void *arg) {
    const norm_arg *a = (const norm_arg *)arg;
    tb_tensor *x = a->prologue ? tb_mul_scalar(in[0], 3.0) : tb_tensor_retain(in[0]), *y, *t;
    if (a->which == 0) {
        y = tb_softmax(x, a->axis);
    } else if (a->which == 1) {
        y = tb_log_softmax(x, a->axis);
    } else {
        y = tb_layer_norm(x, a->axis, a->weight ? in[1] : NULL, a->bias ? in[2] : NULL, 1e-5);
    }
    tb_tensor_release(x);
    if (a->epilogue) {
        t = tb_add_scalar(y, 1.0);
        tb_tensor_release(y);
        y = tb_tanh(t);
        tb_tensor_release(t);
    }
    return y;
}

static void test_softmax_layer_norm(void **state) {
    static norm_arg args[64];
    size_t n = 0;
    int which;
    int32_t axis;
    input in[3];
    (void)state;
    REQUIRE_OPENCL();
    for (which = 0; which < 2; which++) {
        for (axis = -3; axis < 3; axis++) {
            norm_arg *a;
            char name[96];
            if (axis == -3 || axis == 2) continue; /* as 0 and -1 */
            a = &args[n++];
            memset(a, 0, sizeof *a);
            a->which = which;
            a->axis = axis;
            a->prologue = axis == 0;
            a->epilogue = axis == -1;
            in[0] = in_of(shp(TB_F32, 3, 4, 5, 6, 0), R_ANY);
            snprintf(name, sizeof name, "%s axis %d", which ? "log_softmax" : "softmax", (int)axis);
            add_case(name, build_norm, a, in, 1);
        }
        {
            norm_arg *a = &args[n++];
            memset(a, 0, sizeof *a);
            a->which = which;
            a->axis = 1;
            in[0] = in_of(shp(TB_F64, 2, 3, 3000, 0, 0), R_ANY);
            add_case("softmax of long f64 rows", build_norm, a, in, 1);
        }
    }
    for (axis = 1; axis <= 2; axis++) {
        int wb;
        for (wb = 0; wb < 4; wb++) {
            norm_arg *a;
            char name[96];
            if ((wb == 0 || wb == 3) != (axis == 1)) continue;
            a = &args[n++];
            memset(a, 0, sizeof *a);
            a->which = 2;
            a->axis = axis;
            a->weight = (wb & 1) != 0;
            a->bias = (wb & 2) != 0;
            a->epilogue = wb == 3;
            a->prologue = wb == 1;
            in[0] = in_of(shp(TB_F32, 3, 3, 4, 5, 0), R_ANY);
            in[1] =
                in_of(axis == 1 ? shp(TB_F32, 1, 5, 0, 0, 0) : shp(TB_F32, 2, 4, 5, 0, 0), R_ANY);
            in[2] = in[1];
            snprintf(name, sizeof name, "layer_norm over %d dims%s%s", (int)axis,
                     a->weight ? " weight" : "", a->bias ? " bias" : "");
            add_case(name, build_norm, a, in, 3);
        }
    }
    {
        norm_arg *a = &args[n++];
        memset(a, 0, sizeof *a);
        a->which = 2;
        a->axis = 1;
        in[0] = in_of(shp(TB_F32, 2, 2, 4096, 0, 0), R_ANY);
        add_case("layer_norm of long rows", build_norm, a, in, 1);
    }
    flush_cases();
}

/* The code a GPU gets (local-memory matmul tiles, a work-group per row, split reductions
   with work-groups per chunk), run on whatever device is here through the code generator's
   test hook. */
static void test_gpu_code_paths(void **state) {
    static const mm_arg relu_bias = {2, false, false, false}, plain = {0, false, false, false},
                        transposed_bias = {2, true, false, false};
    static reduce_arg red[6];
    static norm_arg norm[2];
    input in[3];
    int i;
    (void)state;
    REQUIRE_OPENCL();
#ifndef TB_NO_OPENCL
    tb__ocl_codegen_as_gpu = 1;
#endif
    tb_computation_cache_clear();
    in[0] = in_of(shp(TB_F32, 2, 70, 33, 0, 0), R_ANY);
    in[1] = in_of(shp(TB_F32, 2, 33, 90, 0, 0), R_ANY);
    in[2] = in_of(shp(TB_F32, 1, 90, 0, 0, 0), R_ANY);
    add_case("tiled relu(matmul + bias)", build_matmul, &relu_bias, in, 3);
    in[1] = in_of(shp(TB_F32, 2, 90, 33, 0, 0), R_ANY);
    add_case("tiled relu(matmul(a, b^T) + bias)", build_matmul, &transposed_bias, in, 3);
    in[0] = in_of(shp(TB_I32, 3, 3, 6, 5, 0), R_ANY);
    in[1] = in_of(shp(TB_I32, 3, 3, 5, 7, 0), R_ANY);
    add_case("tiled batched i32 matmul", build_matmul, &plain, in, 2);
    in[0] = in_of(shp(TB_F64, 1, 40, 0, 0, 0), R_ANY);
    in[1] = in_of(shp(TB_F64, 2, 40, 3, 0, 0), R_ANY);
    add_case("tiled f64 vector x matrix", build_matmul, &plain, in, 2);
    for (i = 0; i < 6; i++) {
        memset(&red[i], 0, sizeof red[i]);
        red[i].which = i;
        red[i].axes[0] = 1;
        red[i].num_axes = 1;
        red[i].prologue = i < 2;
    }
    in[0] = in_of(shp(TB_F32, 2, 3, 3000, 0, 0), R_WHOLE);
    for (i = 0; i < 6; i++)
        add_case("work-group reduction", build_reduce, &red[i], in, 1);
    in[0] = in_of(shp(TB_F32, 2, 2, 70000, 0, 0), R_ANY);
    for (i = 0; i < 4; i++)
        add_case("split reduction", build_reduce, &red[i], in, 1);
    for (i = 0; i < 2; i++) {
        memset(&norm[i], 0, sizeof norm[i]);
        norm[i].which = i == 0 ? 0 : 2;
        norm[i].axis = 1;
        norm[i].epilogue = true;
    }
    in[0] = in_of(shp(TB_F32, 2, 5, 2000, 0, 0), R_ANY);
    add_case("work-group softmax", build_norm, &norm[0], in, 1);
    add_case("work-group layer_norm", build_norm, &norm[1], in, 1);
    flush_cases();
#ifndef TB_NO_OPENCL
    tb__ocl_codegen_as_gpu = 0;
#endif
    tb_computation_cache_clear();
}

/* ---- movement, copies, generators ---- */

typedef struct move_arg {
    int which;
} move_arg;

static tb_tensor *take(tb_tensor *old, tb_tensor *new_value) {
    tb_tensor_release(old);
    return new_value;
}

/* Each builds a view chain on a [4,6,5] input and ends with an elementwise op (so the view is
   read by a kernel rather than being a plain copy). */
static tb_tensor *build_move(tb_tensor **in, const void *arg) {
    int which = ((const move_arg *)arg)->which;
    tb_tensor *x = tb_tensor_retain(in[0]);
    switch (which) {
    case 0: {
        int64_t d[2] = {24, 5};
        x = take(x, tb_reshape(x, d, 2));
        break;
    }
    case 1: {
        int32_t p[3] = {2, 0, 1};
        x = take(x, tb_permute(x, p, 3));
        break;
    }
    case 2:
        x = take(x, tb_transpose(x, 0, 2));
        break;
    case 3:
        x = take(x, tb_slice(x, 1, 1, 6, 2));
        break;
    case 4:
        x = take(x, tb_slice(x, 2, -3, 100, 1));
        break;
    case 5: {
        int32_t f[2] = {0, 2};
        x = take(x, tb_flip(x, f, 2));
        break;
    }
    case 6: {
        int64_t d[4] = {3, 4, 6, 5};
        x = take(x, tb_expand(x, d, 4));
        break;
    }
    case 7: {
        x = take(x, tb_unsqueeze(x, 1));
        x = take(x, tb_squeeze(x, 1));
        break;
    }
    case 8: { /* permute then reshape (merge of non-contiguous dims) */
        int32_t p[3] = {1, 0, 2};
        int64_t d[2] = {24, 5};
        x = take(x, tb_permute(x, p, 3));
        x = take(x, tb_reshape(x, d, 2));
        break;
    }
    case 9: { /* slice, flip, transpose, reshape (split), expand */
        int32_t f[1] = {1};
        int64_t d[3] = {2, 3, 10}, e[4] = {2, 2, 3, 10};
        x = take(x, tb_slice(x, 0, 0, 4, 2));
        x = take(x, tb_flip(x, f, 1));
        x = take(x, tb_transpose(x, 1, 2));
        x = take(x, tb_reshape(x, d, 3));
        x = take(x, tb_unsqueeze(x, 0));
        x = take(x, tb_expand(x, e, 4));
        break;
    }
    case 10: { /* flatten then split differently */
        int64_t flat = 120, d[3] = {5, 8, 3};
        x = take(x, tb_transpose(x, 1, 2));
        x = take(x, tb_reshape(x, &flat, 1));
        x = take(x, tb_reshape(x, d, 3));
        break;
    }
    case 11: { /* a view of a computed value */
        int32_t p[3] = {2, 1, 0};
        x = take(x, tb_exp(x));
        x = take(x, tb_permute(x, p, 3));
        x = take(x, tb_slice(x, 0, 1, 5, 3));
        break;
    }
    default: {
        int64_t d[1] = {120};
        x = take(x, tb_reshape(x, d, 1));
        x = take(x, tb_slice(x, 0, 3, 120, 7));
        break;
    }
    }
    return take(x, tb_mul_scalar(x, 1.5));
}

static tb_tensor *build_move_result(tb_tensor **in, const void *arg) {
    /* the view itself is a result: a copy kernel reads through the index arithmetic */
    int32_t p[3] = {1, 2, 0};
    (void)arg;
    return tb_permute(in[0], p, 3);
}

static void test_movement(void **state) {
    static move_arg args[13];
    int i;
    input in = in_of(shp(TB_F32, 3, 4, 6, 5, 0), R_ANY);
    (void)state;
    REQUIRE_OPENCL();
    for (i = 0; i < 13; i++) {
        char name[64];
        args[i].which = i;
        snprintf(name, sizeof name, "view chain #%d", i);
        add_case(name, build_move, &args[i], &in, 1);
    }
    add_case("permuted view as a result", build_move_result, NULL, &in, 1);
    in.shape.dtype = TB_I64;
    add_case("permuted i64 view as a result", build_move_result, NULL, &in, 1);
    flush_cases();
}

typedef struct other_arg {
    int which;
} other_arg;

static tb_tensor *build_other(tb_tensor **in, const void *arg) {
    int which = ((const other_arg *)arg)->which;
    switch (which) {
    case 0:
        return tb_concat(in, 3, 1);
    case 1: {
        tb_tensor *t[3], *y;
        t[0] = tb_exp(in[0]);
        t[1] = tb_transpose(in[1], 0, 1);
        t[2] = in[2];
        y = tb_concat(t, 3, 0);
        tb_tensor_release(t[0]);
        tb_tensor_release(t[1]);
        return y;
    }
    case 2: {
        int64_t pads[4] = {1, 2, 0, 3};
        return tb_pad(in[0], pads, 4, -7.5);
    }
    case 3: {
        int64_t pads[4] = {0, 0, 2, 0};
        tb_tensor *e = tb_sigmoid(in[0]), *y = tb_pad(e, pads, 4, 0.25);
        tb_tensor_release(e);
        return take(y, tb_mul_scalar(y, 2.0));
    }
    case 4:
        return tb_gather(in[0], 1, in[1]);
    case 5:
        return tb_index_select(in[0], 0, in[1]);
    case 6: {
        tb_tensor *g = tb_gather(in[0], 0, in[1]), *y = tb_sum(g, NULL, 0, false);
        tb_tensor_release(g);
        return y;
    }
    default: {
        tb_tensor *s = tb_index_select(in[0], 1, in[1]);
        return take(s, tb_relu(s));
    }
    }
}

static void test_concat_pad_gather(void **state) {
    static other_arg args[8];
    input in[3];
    int i;
    (void)state;
    REQUIRE_OPENCL();
    for (i = 0; i < 8; i++)
        args[i].which = i;
    in[0] = in_of(shp(TB_F32, 2, 3, 2, 0, 0), R_ANY);
    in[1] = in_of(shp(TB_F32, 2, 3, 0, 0, 0), R_ANY);
    in[2] = in_of(shp(TB_F32, 2, 3, 5, 0, 0), R_ANY);
    add_case("concat along dim 1 (with an empty input)", build_other, &args[0], in, 3);
    in[0] = in_of(shp(TB_F32, 2, 2, 4, 0, 0), R_ANY);
    in[1] = in_of(shp(TB_F32, 2, 4, 3, 0, 0), R_ANY);
    in[2] = in_of(shp(TB_F32, 2, 1, 4, 0, 0), R_ANY);
    add_case("concat of computed and viewed inputs", build_other, &args[1], in, 3);
    in[0] = in_of(shp(TB_F32, 2, 3, 4, 0, 0), R_ANY);
    add_case("pad", build_other, &args[2], in, 1);
    add_case("pad of a computed value", build_other, &args[3], in, 1);
    in[0].shape.dtype = TB_I32;
    add_case("pad i32", build_other, &args[2], in, 1);
    in[0] = in_of(shp(TB_F32, 2, 4, 6, 0, 0), R_ANY);
    in[1] = in_of(shp(TB_I64, 2, 3, 5, 0, 0), R_INDEX);
    in[1].hi = 6;
    add_case("gather dim 1", build_other, &args[4], in, 2);
    in[1] = in_of(shp(TB_I32, 2, 3, 6, 0, 0), R_INDEX);
    in[1].hi = 4;
    add_case("gather dim 0, summed", build_other, &args[6], in, 2);
    in[1] = in_of(shp(TB_I32, 1, 7, 0, 0, 0), R_INDEX);
    in[1].hi = 4;
    add_case("index_select dim 0", build_other, &args[5], in, 2);
    in[1] = in_of(shp(TB_I64, 1, 9, 0, 0, 0), R_INDEX);
    in[1].hi = 6;
    add_case("relu(index_select dim 1)", build_other, &args[7], in, 2);
    flush_cases();
}

/* ---- convolution and pooling (matmuls over windows, pads; tests/test_conv.c has the rest) ---- */

typedef struct conv_arg {
    int which; /* 0 conv2d (stride, padding, dilation, groups, bias), 1 conv_transpose2d,
                  2 max_pool2d, 3 avg_pool2d, 4 the gradient of sum(conv2d(x, w) * x') wrt x */
} conv_arg;

static tb_tensor *build_conv(tb_tensor **in, const void *arg) {
    static const int64_t one[2] = {1, 1}, two[2] = {2, 2}, k3[2] = {3, 3}, dil[2] = {2, 1};
    int which = ((const conv_arg *)arg)->which;
    switch (which) {
    case 0:
        return tb_conv2d(in[0], in[1], in[2], two, one, dil, 2);
    case 1:
        return tb_conv_transpose2d(in[0], in[1], in[2], two, one, one, one, 1);
    case 2:
        return tb_max_pool2d(in[0], k3, two, one, NULL, true);
    case 3:
        return tb_avg_pool2d(in[0], k3, two, one, false, false);
    default: {
        tb_tensor *x = tb_detach(in[0]), *y, *p, *l, *g = NULL;
        tb_set_requires_grad(x, true);
        y = tb_conv2d(x, in[1], NULL, one, one, NULL, 1);
        p = tb_mul(y, y);
        l = tb_sum(p, NULL, 0, false);
        if (tb_grad(l, NULL, &x, 1, &g) != TB_OK) g = NULL;
        tb_tensor_release(x);
        tb_tensor_release(y);
        tb_tensor_release(p);
        tb_tensor_release(l);
        return g;
    }
    }
}

static void test_conv_pool(void **state) {
    static conv_arg args[5];
    input in[3];
    int i;
    (void)state;
    REQUIRE_OPENCL();
    for (i = 0; i < 5; i++)
        args[i].which = i;
    in[0] = in_of(shp(TB_F32, 4, 2, 4, 9, 8), R_ANY);
    in[1] = in_of(shp(TB_F32, 4, 6, 2, 3, 3), R_ANY);
    in[2] = in_of(shp(TB_F32, 1, 6, 0, 0, 0), R_ANY);
    add_case("conv2d stride 2, padding 1, dilation (2, 1), groups 2, bias", build_conv, &args[0],
             in, 3);
    in[1] = in_of(shp(TB_F32, 4, 4, 3, 3, 3), R_ANY);
    in[2] = in_of(shp(TB_F32, 1, 3, 0, 0, 0), R_ANY);
    add_case("conv_transpose2d stride 2, padding 1, output_padding 1, bias", build_conv, &args[1],
             in, 3);
    in[0].range = R_WHOLE; /* ties */
    add_case("max_pool2d 3x3 stride 2, padding 1, ceil", build_conv, &args[2], in, 1);
    in[0].range = R_ANY;
    add_case("avg_pool2d 3x3 stride 2, padding 1", build_conv, &args[3], in, 1);
    in[1] = in_of(shp(TB_F32, 4, 5, 4, 3, 3), R_ANY);
    add_case("gradient of a conv2d wrt its input", build_conv, &args[4], in, 2);
    flush_cases();
}

/* ---- concats of many inputs ----
   A concat of more than a few inputs is written by kernels of its own, one per run of its
   inputs: buffers read through a table of the kernel's arguments (native), scalars read from
   the table of scalars, or a balanced tree of tests (views, computed inputs, and buffers where
   arguments cannot be read through a table). */

enum { CAT_HOST, CAT_SCALAR, CAT_VIEW, CAT_COMPUTED, CAT_MIXED, CAT_REPEAT, CAT_HALF };

typedef struct cat_spec {
    const char *name;
    int32_t n;          /* inputs */
    int32_t rank, dim;  /* inputs of rank 1 to 3 ([len], [2, len], [2, len, 3] with len along
                           dim, the other dims 2 and 3), concatenated along dim */
    int32_t lens, zero; /* input i's length along dim: zero + i % lens (zero 0: some empty) */
    int kind;
} cat_spec;

static tb_shape cat_input_shape(const cat_spec *c, int32_t i, tb_dtype dtype) {
    int64_t d[3] = {2, 2, 3}, len = c->zero + i % c->lens;
    if (c->rank == 1) return shp(dtype, 1, len, 0, 0, 0);
    d[c->dim] = len;
    if (c->rank == 2) return shp(dtype, 2, d[0], d[1], 0, 0);
    return shp(dtype, 3, d[0], d[1], d[2], 0);
}

/* Input i of a case on `dev`: the same values on every device (seeded by i). */
static tb_tensor *cat_input(const cat_spec *c, int32_t i, const tb_device *dev) {
    int kind = c->kind == CAT_MIXED ? (i / 10) % 5 : c->kind;
    tb_dtype dtype = c->kind == CAT_HALF ? TB_F16 : TB_F32;
    tb_shape s;
    tb_tensor *x, *y;
    void *host;
    uint64_t saved = g_rng;
    if (c->kind == CAT_HALF) kind = (i / 10) % 2 == 0 ? CAT_HOST : CAT_SCALAR;
    if (c->kind == CAT_MIXED && kind == 1) dtype = TB_I32; /* buffers of another dtype */
    if (c->kind == CAT_REPEAT) i = 0;
    s = cat_input_shape(c, i, dtype);
    if (kind == CAT_SCALAR || (c->kind == CAT_MIXED && kind == 2)) {
        if (c->kind == CAT_MIXED) s.dtype = TB_I64;
        return tb_full(&s, (double)(i % 7) - 3.0, dev);
    }
    if (kind == CAT_VIEW || (c->kind == CAT_MIXED && kind == 3)) {
        tb_shape t = s;
        int32_t a = s.rank >= 2 ? 0 : -1;
        if (a >= 0) {
            t.dims[0] = s.dims[1];
            t.dims[1] = s.dims[0];
        }
        g_rng = 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1);
        host = host_alloc(&t);
        fill(host, &t, R_ANY, 0);
        g_rng = saved;
        x = tb_tensor_from_host(host, &t, dev);
        free(host);
        if (a < 0) { /* rank 1: a reversed view */
            int32_t f = 0;
            y = tb_flip(x, &f, 1);
        } else {
            y = tb_transpose(x, 0, 1);
        }
        tb_tensor_release(x);
        return y;
    }
    g_rng = 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1);
    host = host_alloc(&s);
    fill(host, &s, R_ANY, 0);
    g_rng = saved;
    x = tb_tensor_from_host(host, &s, dev);
    free(host);
    if (kind == CAT_COMPUTED || (c->kind == CAT_MIXED && kind == 4)) {
        y = tb_exp(x);
        tb_tensor_release(x);
        return y;
    }
    return x;
}

static tb_tensor *cat_build(const cat_spec *c, const tb_device *dev) {
    tb_tensor **in = (tb_tensor **)calloc((size_t)c->n, sizeof *in), *y;
    int32_t i;
    assert_non_null(in);
    for (i = 0; i < c->n; i++) {
        in[i] = cat_input(c, i, dev);
        if (in[i] == NULL) fail_msg("%s: input %d: %s", c->name, (int)i, tb_last_error());
    }
    y = tb_concat(in, (size_t)c->n, c->dim);
    if (y == NULL) fail_msg("%s: tb_concat: %s", c->name, tb_last_error());
    for (i = 0; i < c->n; i++)
        tb_tensor_release(in[i]);
    free(in);
    return y;
}

static void cat_check(const cat_spec *c) {
    tb_tensor *ref = cat_build(c, &g_cpu), *got = cat_build(c, &g_ocl);
    check_names_of(c->name, &got, 1);
    compare_tensors(c->name, ref, got);
    tb_tensor_release(ref);
    tb_tensor_release(got);
}

static const cat_spec cat_cases[] = {
    {"concat of 1 input", 1, 1, 0, 1, 1, CAT_HOST},
    {"concat of 9 one-element inputs", 9, 1, 0, 1, 1, CAT_HOST},
    {"concat of 300 one-element inputs", 300, 1, 0, 1, 1, CAT_HOST},
    {"concat of 300 one-element scalars", 300, 1, 0, 1, 1, CAT_SCALAR},
    {"concat of 9 [2, n, 3] along dim 1", 9, 3, 1, 3, 1, CAT_HOST},
    {"concat of 300 [n, 2, 3] along dim 0", 300, 3, 0, 3, 1, CAT_HOST},
    {"concat of 300 [2, n, 3] along dim 1, some empty", 300, 3, 1, 3, 0, CAT_HOST},
    {"concat of 300 [2, 2, n] along dim 2", 300, 3, 2, 2, 1, CAT_HOST},
    {"concat of 300 expanded scalars [2, n] along dim 1", 300, 2, 1, 3, 1, CAT_SCALAR},
    {"concat of 40 transposed views along dim 0", 40, 2, 0, 2, 1, CAT_VIEW},
    {"concat of 40 flipped views", 40, 1, 0, 3, 1, CAT_VIEW},
    {"concat of 40 computed inputs", 40, 1, 0, 2, 1, CAT_COMPUTED},
    {"concat of 300 mixed inputs and dtypes [2, n] along dim 1", 300, 2, 1, 2, 1, CAT_MIXED},
    {"concat of one input 100 times", 100, 1, 0, 3, 1, CAT_REPEAT},
    {"concat of 60 f16 buffers and scalars", 60, 2, 1, 2, 1, CAT_HALF},
};

static void test_concat_many_inputs(void **state) {
    size_t i;
    (void)state;
    REQUIRE_OPENCL();
    for (i = 0; i < sizeof cat_cases / sizeof cat_cases[0]; i++)
        cat_check(&cat_cases[i]);
}

/* Many inputs in little time and little code: 20,000 one-element tensors (native: buffers
   read through the table of arguments; every backend: scalars from the table of scalars),
   and the program of 2,000 inputs stays small (a concat written as one test per input is
   hundreds of kilobytes of code). */
static void test_concat_many_inputs_large(void **state) {
    static const cat_spec large[] = {
        {"concat of 20000 one-element inputs", 20000, 1, 0, 1, 1, CAT_HOST},
        {"concat of 20000 one-element scalars", 20000, 1, 0, 1, 1, CAT_SCALAR},
    };
    cat_spec small[2] = {{"2000 scalars", 2000, 1, 0, 1, 1, CAT_SCALAR},
                         {"2000 one-element inputs", 2000, 1, 0, 1, 1, CAT_HOST}};
    size_t i;
    (void)state;
    REQUIRE_OPENCL();
    /* first the size, which code growing with the inputs fails in seconds */
    for (i = 0; i < (TEST_OPENCL ? 1u : 2u); i++) {
        tb_tensor *y = cat_build(&small[i], &g_ocl);
        char *text = tb_ir_backend_text(&y, 1);
        if (text == NULL) fail_msg("%s: tb_ir_backend_text: %s", small[i].name, tb_last_error());
        if (strlen(text) > 65536)
            fail_msg("%s: the program is %zu bytes", small[i].name, strlen(text));
        tb_free(text);
        if (kernel_count(&y, 1) > 2) fail_msg("%s: more than 2 kernels", small[i].name);
        tb_tensor_release(y);
    }
    for (i = TEST_OPENCL ? 1 : 0; i < 2; i++) {
        tb_tensor *ref = cat_build(&large[i], &g_cpu), *got = cat_build(&large[i], &g_ocl);
        compare_tensors(large[i].name, ref, got);
        tb_tensor_release(ref);
        tb_tensor_release(got);
    }
}

/* The same with the code a GPU gets (the test hook of test_gpu_code_paths). */
static void test_concat_many_inputs_gpu(void **state) {
    (void)state;
    REQUIRE_OPENCL();
#ifndef TB_NO_OPENCL
    tb__ocl_codegen_as_gpu = 1;
#endif
    tb_computation_cache_clear();
    test_concat_many_inputs(state);
#ifndef TB_NO_OPENCL
    tb__ocl_codegen_as_gpu = 0;
#endif
    tb_computation_cache_clear();
}

/* Gradients through a concat of many inputs: each input's gradient is its slice of the
   seed. */
static void test_concat_many_inputs_grad(void **state) {
    enum { N = 20 };
    const tb_device *devs[2] = {&g_cpu, &g_ocl};
    tb_tensor *grads[2][N];
    int d, i;
    (void)state;
    REQUIRE_OPENCL();
    for (d = 0; d < 2; d++) {
        tb_tensor *x[N], *y, *w, *prod, *loss;
        tb_shape ws = shp(TB_F32, 2, 2, 0, 0, 0);
        float *wh;
        int64_t total = 0;
        for (i = 0; i < N; i++) {
            tb_shape s = shp(TB_F32, 2, 2, 1 + i % 3, 0, 0);
            float h[6];
            int j;
            for (j = 0; j < 6; j++)
                h[j] = (float)(i * 6 + j) * 0.25f - 3.0f;
            x[i] = tb_tensor_from_host(h, &s, devs[d]);
            assert_int_equal(tb_set_requires_grad(x[i], true), TB_OK);
            total += 1 + i % 3;
        }
        ws.dims[1] = total;
        wh = (float *)calloc((size_t)(2 * total), sizeof *wh);
        assert_non_null(wh);
        for (i = 0; i < 2 * total; i++)
            wh[i] = (float)(i % 11) - 5.0f;
        w = tb_tensor_from_host(wh, &ws, devs[d]);
        free(wh);
        y = tb_concat(x, N, 1);
        prod = tb_mul(y, w);
        loss = tb_sum(prod, NULL, 0, false);
        if (tb_grad(loss, NULL, x, N, grads[d]) != TB_OK) fail_msg("tb_grad: %s", tb_last_error());
        for (i = 0; i < N; i++)
            tb_tensor_release(x[i]);
        tb_tensor_release(y);
        tb_tensor_release(w);
        tb_tensor_release(prod);
        tb_tensor_release(loss);
    }
    for (i = 0; i < N; i++) {
        compare_tensors("gradient through a concat of 20 inputs", grads[0][i], grads[1][i]);
        tb_tensor_release(grads[0][i]);
        tb_tensor_release(grads[1][i]);
    }
}

static void test_generators(void **state) {
    tb_tensor *c[8], *o[8];
    size_t i;
    (void)state;
    REQUIRE_OPENCL();
    c[0] = tb_arange(0.5, 7.25, 0.25, TB_F32, &g_cpu);
    o[0] = tb_arange(0.5, 7.25, 0.25, TB_F32, &g_ocl);
    c[1] = tb_arange(-3, 40, 3, TB_I64, &g_cpu);
    o[1] = tb_arange(-3, 40, 3, TB_I64, &g_ocl);
    c[2] = tb_arange(0.1, 3.3, 0.1, TB_F64, &g_cpu);
    o[2] = tb_arange(0.1, 3.3, 0.1, TB_F64, &g_ocl);
    c[3] = tb_eye(4, 6, TB_F32, &g_cpu);
    o[3] = tb_eye(4, 6, TB_F32, &g_ocl);
    c[4] = tb_eye(5, -1, TB_BOOL, &g_cpu);
    o[4] = tb_eye(5, -1, TB_BOOL, &g_ocl);
    c[5] = tb_mul_scalar(c[0], 2.0);
    o[5] = tb_mul_scalar(o[0], 2.0);
    {
        tb_shape s = shp(TB_F32, 2, 3, 4, 0, 0);
        c[6] = tb_full(&s, 2.5, &g_cpu);
        o[6] = tb_full(&s, 2.5, &g_ocl);
        c[7] = tb_add(c[6], c[3]);
        o[7] = tb_add(o[6], o[3]);
        /* c[7] is [3,4] + [4,6]: not broadcastable, so build something that is */
        tb_tensor_release(c[7]);
        tb_tensor_release(o[7]);
        s = shp(TB_F32, 2, 4, 6, 0, 0);
        tb_tensor_release(c[6]);
        tb_tensor_release(o[6]);
        c[6] = tb_zeros(&s, &g_cpu);
        o[6] = tb_zeros(&s, &g_ocl);
        c[7] = tb_sub(c[3], c[6]);
        o[7] = tb_sub(o[3], o[6]);
    }
    for (i = 0; i < 8; i++) {
        char name[32];
        assert_non_null(c[i]);
        assert_non_null(o[i]);
        snprintf(name, sizeof name, "generator #%zu", i);
        compare_tensors(name, c[i], o[i]);
        tb_tensor_release(c[i]);
        tb_tensor_release(o[i]);
    }
}

/* ---- awkward shapes: rank 0, size 0, size 1 ---- */

typedef struct edge_arg {
    int which;
} edge_arg;

static tb_tensor *build_edge(tb_tensor **in, const void *arg) {
    int which = ((const edge_arg *)arg)->which;
    int32_t ax = 1;
    switch (which) {
    case 0:
        return tb_mul_scalar(in[0], 3.0); /* rank 0 */
    case 1:
        return tb_add(in[0], in[1]); /* rank 0 + [3,4] */
    case 2:
        return tb_sum(in[0], &ax, 1, false); /* [4,0] -> [4] of zeros */
    case 3:
        return tb_mean(in[0], &ax, 1, true); /* [4,0] -> [4,1] of NaN */
    case 4:
        return tb_exp(in[0]); /* [4,0] */
    case 5:
        return tb_sum(in[0], NULL, 0, false); /* rank 0 result */
    case 6:
        return tb_softmax(in[0], 0); /* [1] */
    case 7:
        return tb_matmul(in[0], in[1]); /* [1,1] x [1,1] */
    default: {
        tb_tensor *t = tb_sum(in[0], NULL, 0, true), *y = tb_add(in[0], t); /* [1,1,1] */
        tb_tensor_release(t);
        return y;
    }
    }
}

static void test_edge_shapes(void **state) {
    static edge_arg args[9];
    tb_shape r0 = shp(TB_F32, 0, 0, 0, 0, 0);
    input in[2];
    int i;
    (void)state;
    REQUIRE_OPENCL();
    for (i = 0; i < 9; i++)
        args[i].which = i;
    in[0] = in_of(r0, R_ANY);
    add_case("rank-0 op", build_edge, &args[0], in, 1);
    in[1] = in_of(shp(TB_F32, 2, 3, 4, 0, 0), R_ANY);
    add_case("rank 0 broadcast over [3,4]", build_edge, &args[1], in, 2);
    in[0] = in_of(shp(TB_F32, 2, 4, 0, 0, 0), R_ANY);
    add_case("sum over an empty axis", build_edge, &args[2], in, 1);
    add_case("mean over an empty axis", build_edge, &args[3], in, 1);
    add_case("elementwise on an empty array", build_edge, &args[4], in, 1);
    in[0] = in_of(shp(TB_F32, 3, 2, 3, 4, 0), R_ANY);
    add_case("sum of everything", build_edge, &args[5], in, 1);
    in[0] = in_of(shp(TB_F32, 1, 1, 0, 0, 0), R_ANY);
    add_case("softmax of one element", build_edge, &args[6], in, 1);
    in[0] = in_of(shp(TB_F32, 2, 1, 1, 0, 0), R_ANY);
    in[1] = in[0];
    add_case("matmul of [1,1]", build_edge, &args[7], in, 2);
    in[0] = in_of(shp(TB_F32, 3, 1, 1, 1, 0), R_ANY);
    add_case("size-1 dims everywhere", build_edge, &args[8], in, 1);
    flush_cases_direct();
}

/* ---- random streams ---- */

static void test_rand_bit_identical(void **state) {
    const tb_dtype dtypes[] = {TB_F32, TB_F64};
    size_t d, k, bytes = 0;
    (void)state;
    REQUIRE_OPENCL();
    for (d = 0; d < 2; d++) {
        for (k = 0; k < 2; k++) {
            tb_shape s = shp(dtypes[d], 2, 37, 101, 0, 0);
            tb_tensor *c, *o, *c2, *o2;
            void *a = host_alloc(&s), *b = host_alloc(&s);
            assert_int_equal(tb_shape_nbytes(&s, &bytes), TB_OK);
            tb_manual_seed(1234 + d);
            c = k == 0 ? tb_rand(&s, &g_cpu) : tb_randn(&s, &g_cpu);
            c2 = k == 0 ? tb_rand(&s, &g_cpu) : tb_randn(&s, &g_cpu);
            tb_manual_seed(1234 + d);
            o = k == 0 ? tb_rand(&s, &g_ocl) : tb_randn(&s, &g_ocl);
            o2 = k == 0 ? tb_rand(&s, &g_ocl) : tb_randn(&s, &g_ocl);
            assert_non_null(c);
            assert_non_null(o);
            assert_int_equal(tb_tensor_to_host(c, a, bytes), TB_OK);
            assert_int_equal(tb_tensor_to_host(o, b, bytes), TB_OK);
            if (memcmp(a, b, bytes) != 0) {
                fail_msg("%s %s: not bit-identical to the cpu backend", k ? "randn" : "rand",
                         tb_dtype_name(dtypes[d]));
            }
            /* the second call continues the stream */
            assert_int_equal(tb_tensor_to_host(c2, a, bytes), TB_OK);
            assert_int_equal(tb_tensor_to_host(o2, b, bytes), TB_OK);
            assert_memory_equal(a, b, bytes);
            tb_tensor_release(c);
            tb_tensor_release(o);
            tb_tensor_release(c2);
            tb_tensor_release(o2);
            free(a);
            free(b);
        }
    }
    /* a random tensor used inside a fused graph */
    {
        tb_shape s = shp(TB_F32, 1, 1000, 0, 0, 0);
        tb_tensor *c, *o, *cr, *orr;
        tb_manual_seed(7);
        cr = tb_rand(&s, &g_cpu);
        tb_manual_seed(7);
        orr = tb_rand(&s, &g_ocl);
        c = tb_sum(cr, NULL, 0, false);
        o = tb_sum(orr, NULL, 0, false);
        compare_tensors("sum of rand", c, o);
        tb_tensor_release(c);
        tb_tensor_release(o);
        tb_tensor_release(cr);
        tb_tensor_release(orr);
    }
}

/* ---- custom ops ---- */

static tb_status axpb_reference(const void *const *inputs, const tb_shape *input_shapes,
                                size_t num_inputs, void *output, const tb_shape *output_shape,
                                const int64_t *attrs, size_t num_attrs, void *user_data) {
    size_t n = numel_of(output_shape), i, nb = numel_of(&input_shapes[1]);
    const float *a = (const float *)inputs[0], *b = (const float *)inputs[1];
    float *o = (float *)output;
    (void)num_inputs, (void)attrs, (void)num_attrs, (void)user_data;
    for (i = 0; i < n; i++)
        o[i] = a[i] * 2.0f + b[i % nb];
    return TB_OK;
}

static void test_custom_ops(void **state) {
    tb_custom_op_desc d;
    tb_op op;
    input in[2];
    (void)state;
    REQUIRE_OPENCL();
    memset(&d, 0, sizeof d);
    d.name = "ocl_axpb";
    d.num_inputs = 2;
    d.reference = axpb_reference;
    d.opencl_expr = "x0 * (T)2 + x1";
    if (tb_op_lookup("ocl_axpb", &op) != TB_OK) assert_int_equal(tb_op_register(&d, &op), TB_OK);
    {
        float a[12], b[4], ref[12], got[12];
        tb_shape sa = shp(TB_F32, 2, 3, 4, 0, 0), sb = shp(TB_F32, 1, 4, 0, 0, 0);
        tb_tensor *x, *y, *ins[2], *z, *w;
        int i, kernels;
        fill(a, &sa, R_ANY, 0);
        fill(b, &sb, R_ANY, 0);
        for (i = 0; i < 12; i++)
            ref[i] = tanhf(a[i] * 2.0f + b[i % 4]) + 1.0f;
        x = tb_tensor_from_host(a, &sa, &g_ocl);
        y = tb_tensor_from_host(b, &sb, &g_ocl);
        ins[0] = x;
        ins[1] = y;
        z = tb_call_op(op, ins, 2, NULL, 0);
        assert_non_null(z);
        w = tb_tanh(z);
        w = take(w, tb_add_scalar(w, 1.0));
        /* the custom op fuses with its neighbours: one kernel */
        kernels = kernel_count(&w, 1);
        assert_int_equal(kernels, 1);
        assert_int_equal(tb_tensor_to_host(w, got, sizeof got), TB_OK);
        compare_host("custom op with opencl_expr, fused", &sa, ref, got);
        tb_tensor_release(x);
        tb_tensor_release(y);
        tb_tensor_release(z);
        tb_tensor_release(w);
    }
    (void)in;
}

static tb_status copy_reference(const void *const *inputs, const tb_shape *input_shapes,
                                size_t num_inputs, void *output, const tb_shape *output_shape,
                                const int64_t *attrs, size_t num_attrs, void *user_data) {
    size_t bytes = 0;
    (void)input_shapes, (void)num_inputs, (void)attrs, (void)num_attrs, (void)user_data;
    tb_shape_nbytes(output_shape, &bytes);
    memcpy(output, inputs[0], bytes);
    return TB_OK;
}

static void test_custom_op_without_expr_falls_back(void **state) {
    tb_custom_op_desc d;
    tb_op op;
    float a[6] = {1, -2, 3, -4, 5, -6}, got[6];
    tb_shape s = shp(TB_F32, 1, 6, 0, 0, 0);
    tb_tensor *x, *y, *z;
    int i;
    (void)state;
    REQUIRE_OPENCL();
    memset(&d, 0, sizeof d);
    d.name = "ocl_plain_copy";
    d.num_inputs = 1;
    d.reference = copy_reference;
    if (tb_op_lookup("ocl_plain_copy", &op) != TB_OK)
        assert_int_equal(tb_op_register(&d, &op), TB_OK);
    tb_metrics_reset();
    x = tb_tensor_from_host(a, &s, &g_ocl);
    y = tb_call_op(op, &x, 1, NULL, 0);
    z = tb_relu(y);
    assert_int_equal(tb_tensor_to_host(z, got, sizeof got), TB_OK);
    for (i = 0; i < 6; i++)
        assert_true(got[i] == (a[i] > 0 ? a[i] : 0));
    assert_int_equal(tb_metrics_counter("Fallback::ocl_plain_copy"), 1);
    tb_tensor_release(x);
    tb_tensor_release(y);
    tb_tensor_release(z);
}

static void test_custom_op_compile_error(void **state) {
    tb_custom_op_desc d;
    tb_op op;
    float a[4] = {1, 2, 3, 4}, got[4];
    tb_shape s = shp(TB_F32, 1, 4, 0, 0, 0);
    tb_tensor *x, *y;
    tb_status st;
    (void)state;
    REQUIRE_OPENCL();
    memset(&d, 0, sizeof d);
    d.name = "ocl_broken";
    d.num_inputs = 1;
    d.reference = copy_reference;
    d.opencl_expr = "x0 +* no_such_name";
    if (tb_op_lookup("ocl_broken", &op) != TB_OK) assert_int_equal(tb_op_register(&d, &op), TB_OK);
    x = tb_tensor_from_host(a, &s, &g_ocl);
    y = tb_call_op(op, &x, 1, NULL, 0);
    assert_non_null(y);
    st = tb_tensor_to_host(y, got, sizeof got);
    assert_int_equal(st, TB_ERR_COMPILE);
    assert_int_equal(tb_last_status(), TB_ERR_COMPILE);
    assert_non_null(strstr(tb_last_error(), "build log"));
    assert_non_null(strstr(tb_last_error(), "no_such_name"));
    /* the value is not lost: the inputs still work */
    tb_tensor_release(y);
    assert_int_equal(tb_tensor_to_host(x, got, sizeof got), TB_OK);
    assert_memory_equal(a, got, sizeof a);
    tb_tensor_release(x);
}

/* A pack kernel "void <prefix>_<panels>_<depth>_<width>(" in text whose panels of `width`
   cover `len` rows or columns with fewer than one panel of padding, for depth K. */
static void check_pack_kernel(const char *text, const char *prefix, long len, long k) {
    char key[16];
    const char *p;
    long panels = 0, depth = 0, width = 0;
    snprintf(key, sizeof key, "void %s_", prefix);
    p = strstr(text, key);
    if (p == NULL || sscanf(p + strlen(key), "%ld_%ld_%ld(", &panels, &depth, &width) != 3)
        fail_msg("no pack kernel %s in:\n%s", prefix, text);
    assert_int_equal(depth, k);
    assert_true(width >= 4 && width <= 16);
    assert_true(panels * width >= len && (panels - 1) * width < len);
}

/* ---- fusion: kernel counts and values ---- */

static tb_tensor *build_long_chain(tb_tensor **in, const void *arg) {
    int n = *(const int *)arg, i;
    tb_tensor *x = tb_tensor_retain(in[0]);
    for (i = 0; i < n; i++) {
        switch (i % 5) {
        case 0:
            x = take(x, tb_mul_scalar(x, 1.01));
            break;
        case 1:
            x = take(x, tb_add(x, in[1]));
            break; /* broadcast [7] over [5,7] */
        case 2:
            x = take(x, tb_tanh(x));
            break;
        case 3:
            x = take(x, tb_sub(x, in[2]));
            break;
            /* broadcast [5,1] */
        default:
            x = take(x, tb_abs(x));
            break;
        }
    }
    return x;
}

static void test_fusion_patterns(void **state) {
    float a[35], b[7], c[5];
    tb_shape sa = shp(TB_F32, 2, 5, 7, 0, 0), sb = shp(TB_F32, 1, 7, 0, 0, 0),
             sc = shp(TB_F32, 2, 5, 1, 0, 0);
    tb_tensor *x, *y, *z, *t, *u, *v, *outs[4];
    int chain = 200;
    input in[3];
    (void)state;
    REQUIRE_OPENCL();
    fill(a, &sa, R_ANY, 0);
    fill(b, &sb, R_ANY, 0);
    fill(c, &sc, R_ANY, 0);
    x = tb_tensor_from_host(a, &sa, &g_ocl);
    y = tb_tensor_from_host(b, &sb, &g_ocl);
    z = tb_tensor_from_host(c, &sc, &g_ocl);
    {
        tb_tensor *ins[3];
        ins[0] = x;
        ins[1] = y;
        ins[2] = z;
        t = build_long_chain(ins, &chain);
        assert_int_equal(kernel_count(&t, 1), 1); /* 200 elementwise ops with broadcasting */
        tb_tensor_release(t);
    }
    /* reduction with its elementwise producers and an elementwise epilogue: one kernel */
    {
        int32_t ax = 1;
        t = tb_mul(x, y);
        t = take(t, tb_exp(t));
        u = tb_sum(t, &ax, 1, false);
        v = tb_mul_scalar(u, 0.5);
        v = take(v, tb_add_scalar(v, 1.0));
        assert_int_equal(kernel_count(&v, 1), 1);
        tb_tensor_release(t);
        tb_tensor_release(u);
        tb_tensor_release(v);
    }
    /* matmul + bias + relu: one kernel */
    {
        tb_tensor *w = tb_transpose(x, 0, 1); /* [7,5] view */
        t = tb_matmul(x, w);                  /* [5,5] */
        u = tb_add(t, z);                     /* bias [5,1] broadcast */
        u = take(u, tb_relu(u));
        assert_int_equal(kernel_count(&u, 1), 1);
        tb_tensor_release(w);
        tb_tensor_release(t);
        tb_tensor_release(u);
    }
    /* a big matmul + bias + relu: on CPU devices the two operand panels, then one kernel with
       the epilogue; elsewhere one kernel */
    {
        static float big_a[128 * 96], big_b[96 * 80], big_c[80];
        tb_shape sba = shp(TB_F32, 2, 128, 96, 0, 0), sbb = shp(TB_F32, 2, 96, 80, 0, 0);
        tb_shape sbc = shp(TB_F32, 1, 80, 0, 0, 0);
        tb_device_info info;
        tb_tensor *ba, *bb, *bc;
        char *text;
        fill(big_a, &sba, R_ANY, 0);
        fill(big_b, &sbb, R_ANY, 0);
        fill(big_c, &sbc, R_ANY, 0);
        ba = tb_tensor_from_host(big_a, &sba, &g_ocl);
        bb = tb_tensor_from_host(big_b, &sbb, &g_ocl);
        bc = tb_tensor_from_host(big_c, &sbc, &g_ocl);
        t = tb_matmul(ba, bb);
        u = tb_add(t, bc);
        u = take(u, tb_relu(u));
        assert_int_equal(tb_backend_device_info(&g_ocl, &info), TB_OK);
        text = tb_ir_backend_text(&u, 1);
        assert_non_null(text);
        if (info.device.type == TB_DEVICE_CPU) {
            assert_int_equal(kernel_count(&u, 1), 3);
            /* panels of the register block's rows (A) and vector width (B), which the CPU's
               vector shape sets */
            check_pack_kernel(text, "PA", 128, 96);
            check_pack_kernel(text, "PB", 80, 96);
            assert_non_null(strstr(text, "void MM_128_80_96("));
        } else {
            assert_int_equal(kernel_count(&u, 1), 1);
        }
        tb_free(text);
        tb_tensor_release(ba);
        tb_tensor_release(bb);
        tb_tensor_release(bc);
        tb_tensor_release(t);
        tb_tensor_release(u);
    }
    /* softmax of a scaled input, then an elementwise epilogue: one kernel */
    {
        t = tb_mul_scalar(x, 0.125);
        u = tb_softmax(t, -1);
        v = tb_mul(u, y);
        assert_int_equal(kernel_count(&v, 1), 1);
        tb_tensor_release(t);
        tb_tensor_release(u);
        tb_tensor_release(v);
    }
    /* a value used twice in one kernel is computed once; used by two kernels, materialised */
    {
        int32_t ax = 0;
        t = tb_add(x, y);
        t = take(t, tb_sigmoid(t));
        u = tb_mul(t, t);            /* same kernel */
        v = tb_sum(t, &ax, 1, true); /* another kernel reads t */
        outs[0] = u;
        outs[1] = v;
        assert_int_equal(kernel_count(outs, 2), 3);
        tb_tensor_release(t);
        tb_tensor_release(u);
        tb_tensor_release(v);
    }
    /* a view of a parameter read by two kernels is not copied */
    {
        int32_t ax = 1;
        t = tb_transpose(x, 0, 1);
        u = tb_sum(t, &ax, 1, false);
        v = tb_max(t, &ax, 1, false);
        outs[0] = u;
        outs[1] = v;
        assert_int_equal(kernel_count(outs, 2), 2);
        tb_tensor_release(t);
        tb_tensor_release(u);
        tb_tensor_release(v);
    }
    tb_tensor_release(x);
    tb_tensor_release(y);
    tb_tensor_release(z);
    /* the same patterns compared with the cpu backend */
    in[0] = in_of(sa, R_ANY);
    in[1] = in_of(sb, R_ANY);
    in[2] = in_of(sc, R_ANY);
    add_case("chain of 200 elementwise ops", build_long_chain, &chain, in, 3);
    flush_cases();
}

/* A large float max / min (split into chunks, read in vectors): a NaN anywhere propagates,
   without one the result is the exact extreme. */
/* Two layers, relu(x w1 + b) w2, with depths and widths that are not multiples of the panel
   widths: on a CPU device the second matmul reads its A (the first layer's output, computed in
   the same graph, 96 rows: whole panels) where it is, so the program packs only the parameter
   x as an A operand. */
static tb_tensor *two_layers(const tb_device *dev, const float *x, const float *w1, const float *b,
                             const float *w2, tb_shape sx, tb_shape sw1, tb_shape sb,
                             tb_shape sw2) {
    tb_tensor *tx = tb_tensor_from_host(x, &sx, dev), *tw1 = tb_tensor_from_host(w1, &sw1, dev);
    tb_tensor *tb = tb_tensor_from_host(b, &sb, dev), *tw2 = tb_tensor_from_host(w2, &sw2, dev);
    tb_tensor *h = tb_matmul(tx, tw1), *y;
    h = take(h, tb_add(h, tb));
    h = take(h, tb_relu(h));
    y = tb_matmul(h, tw2);
    tb_tensor_release(h);
    tb_tensor_release(tx);
    tb_tensor_release(tw1);
    tb_tensor_release(tb);
    tb_tensor_release(tw2);
    assert_non_null(y);
    return y;
}

/* How many kernels of a program text have names that start with `prefix` (a kernel's name
   after "void ", its helpers' names the kernel's and a suffix). */
static int count_pack_kernels(const char *text, const char *prefix) {
    char names[8][64];
    int count = 0, i;
    size_t plen = strlen(prefix);
    const char *at = text;
    while ((at = strstr(at, "void ")) != NULL) {
        size_t len = 0;
        at += 5;
        if (strncmp(at, prefix, plen) != 0) continue;
        while (len < 63 && (at[len] == '_' || isalnum((unsigned char)at[len])))
            len++;
        for (i = 0; i < count; i++)
            if (strncmp(names[i], at, strlen(names[i])) == 0 || strncmp(names[i], at, len) == 0)
                break;
        if (i == count && count < 8) {
            memcpy(names[count], at, len);
            names[count++][len] = '\0';
        }
    }
    return count;
}

static void test_matmul_reads_a_in_place(void **state) {
    enum { M = 96, K = 70, H = 90, N = 80 };
    static float x[M * K], w1[K * H], b[H], w2[H * N], got[M * N], want[M * N];
    tb_shape sx = shp(TB_F32, 2, M, K, 0, 0), sw1 = shp(TB_F32, 2, K, H, 0, 0);
    tb_shape sb = shp(TB_F32, 1, H, 0, 0, 0), sw2 = shp(TB_F32, 2, H, N, 0, 0);
    tb_shape sy = shp(TB_F32, 2, M, N, 0, 0);
    tb_device_info info;
    tb_tensor *y, *yc;
    char *text;
    (void)state;
    REQUIRE_OPENCL();
    fill(x, &sx, R_ANY, 0);
    fill(w1, &sw1, R_ANY, 0);
    fill(b, &sb, R_ANY, 0);
    fill(w2, &sw2, R_ANY, 0);
    y = two_layers(&g_ocl, x, w1, b, w2, sx, sw1, sb, sw2);
    yc = two_layers(&g_cpu, x, w1, b, w2, sx, sw1, sb, sw2);
    text = tb_ir_backend_text(&y, 1);
    assert_non_null(text);
    assert_int_equal(tb_backend_device_info(&g_ocl, &info), TB_OK);
    if (info.device.type == TB_DEVICE_CPU) { /* packed operands: CPU devices only */
        assert_int_equal(count_pack_kernels(text, "PA_"), 1);
        assert_int_equal(count_pack_kernels(text, "PB_"), 2);
    }
    free(text);
    assert_int_equal(tb_tensor_to_host(y, got, sizeof got), TB_OK);
    assert_int_equal(tb_tensor_to_host(yc, want, sizeof want), TB_OK);
    compare_host("relu(x w1 + b) w2", &sy, want, got);
    tb_tensor_release(y);
    tb_tensor_release(yc);
}

/* A matmul's weight panels are kept with the computation while the same weight buffer comes
   again; a new weight in the same computation (even in a buffer the allocator hands out again
   after the first weight was released) is packed anew. */
static void test_kept_panels_follow_their_buffer(void **state) {
    enum { M = 64, K = 96, N = 80 };
    static float a[M * K], w1[K * N], w2[K * N], got[M * N], want[M * N];
    tb_shape sa = shp(TB_F32, 2, M, K, 0, 0), sw = shp(TB_F32, 2, K, N, 0, 0);
    tb_shape sy = shp(TB_F32, 2, M, N, 0, 0);
    tb_tensor *x, *w, *y, *xc, *wc, *yc;
    int round;
    (void)state;
    REQUIRE_OPENCL();
    fill(a, &sa, R_ANY, 0);
    fill(w1, &sw, R_ANY, 0);
    fill(w2, &sw, R_ANY, 0);
    x = tb_tensor_from_host(a, &sa, &g_ocl);
    xc = tb_tensor_from_host(a, &sa, &g_cpu);
    for (round = 0; round < 6; round++) {
        const float *wh = (round / 2) % 2 == 0 ? w1 : w2; /* w1, w1, w2, w2, w1, w1 */
        w = tb_tensor_from_host(wh, &sw, &g_ocl);
        wc = tb_tensor_from_host(wh, &sw, &g_cpu);
        y = tb_matmul(x, w);
        yc = tb_matmul(xc, wc);
        assert_int_equal(tb_tensor_to_host(y, got, sizeof got), TB_OK);
        assert_int_equal(tb_tensor_to_host(yc, want, sizeof want), TB_OK);
        compare_host("matmul with kept panels", &sy, want, got);
        tb_tensor_release(y);
        tb_tensor_release(yc);
        tb_tensor_release(w); /* its buffer goes back to the allocator for the next round */
        tb_tensor_release(wc);
    }
    tb_tensor_release(x);
    tb_tensor_release(xc);
}

/* The chain of test_long_chain_splits: op i of `ops` is, by i % 5, y + x, -y, y - k, |y|, y * s.
   With x, k in halves and s = +-1 every value is exact in f32, so backends agree bit for bit
   and a kernel that dropped, repeated or reordered a piece of the chain would show. */
static tb_tensor *exact_chain(const tb_device *dev, int ops, const float *x, const float *k,
                              const float *s, int64_t n) {
    tb_shape sh = shp(TB_F32, 1, n, 0, 0, 0);
    tb_tensor *tx = tb_tensor_from_host(x, &sh, dev), *tk = tb_tensor_from_host(k, &sh, dev);
    tb_tensor *ts = tb_tensor_from_host(s, &sh, dev), *y = tb_tensor_retain(tx);
    int i;
    for (i = 0; i < ops; i++) {
        switch (i % 5) {
        case 0:
            y = take(y, tb_add(y, tx));
            break;
        case 1:
            y = take(y, tb_neg(y));
            break;
        case 2:
            y = take(y, tb_sub(y, tk));
            break;
        case 3:
            y = take(y, tb_abs(y));
            break;
        default:
            y = take(y, tb_mul(y, ts));
            break;
        }
    }
    tb_tensor_release(tx);
    tb_tensor_release(tk);
    tb_tensor_release(ts);
    assert_non_null(y);
    return y;
}

/* An elementwise chain of 40,000 ops is more than one kernel's budget: it becomes several
   kernels (it used to fail with "a kernel too large"), and the values are the cpu reference's
   for the whole chain, bit for bit. */
static void test_long_chain_splits(void **state) {
    enum { OPS = 40000, N = 8 };
    static const float x[N] = {1, -2, 3, -4.5f, 5, -6, 7.5f, -8};
    static const float k[N] = {0.5f, 1.5f, -0.5f, 2, -1, 0, 3, -2.5f};
    static const float s[N] = {1, -1, -1, 1, 1, -1, 1, -1};
    float got[N], want[N];
    tb_tensor *y, *ref;
    int i, kernels;
    (void)state;
    REQUIRE_OPENCL();
    y = exact_chain(&g_ocl, OPS, x, k, s, N);
    ref = exact_chain(&g_cpu, OPS, x, k, s, N);
    kernels = kernel_count(&y, 1);
    print_message("%d ops: %d kernels\n", OPS, kernels);
    assert_true(kernels >= 2);
    assert_int_equal(tb_tensor_to_host(y, got, sizeof got), TB_OK);
    assert_int_equal(tb_tensor_to_host(ref, want, sizeof want), TB_OK);
    for (i = 0; i < N; i++) {
        if (got[i] != want[i])
            fail_msg("element %d is %.9g, the reference gives %.9g", i, (double)got[i],
                     (double)want[i]);
    }
    tb_tensor_release(y);
    tb_tensor_release(ref);
}

/* The sum of `n` arrays of 4 values, each from vals[i], on `dev`: a kernel of n - 1 adds that
   reads n arrays, unless the planner splits it. */
static tb_tensor *sum_of_arrays(const tb_device *dev, const float (*vals)[4], int n) {
    tb_shape s = shp(TB_F32, 1, 4, 0, 0, 0);
    tb_tensor *y = tb_tensor_from_host(vals[0], &s, dev);
    int i;
    for (i = 1; i < n; i++) {
        tb_tensor *in = tb_tensor_from_host(vals[i], &s, dev);
        y = take(y, tb_add(y, in));
        tb_tensor_release(in);
    }
    assert_non_null(y);
    return y;
}

/* A sum of more arrays than one kernel may take as arguments is split into kernels that each
   take few enough (it used to fail with "more than the arguments the device takes"). 4096
   arrays fit the values one kernel may compute, but no device takes that many arguments: an
   OpenCL device takes its CL_DEVICE_MAX_PARAMETER_SIZE / 8 (128 on PoCL, 544 to 4095 on GPUs),
   the native backend 4096 including the output. */
static void test_many_arguments_split(void **state) {
    enum { INPUTS = 4096 };
    static float vals[INPUTS][4];
    float got[4], want[4] = {0, 0, 0, 0}, ref_got[4];
    tb_tensor *y, *ref;
    int i, j, kernels;
    (void)state;
    REQUIRE_OPENCL();
    for (i = 0; i < INPUTS; i++) {
        for (j = 0; j < 4; j++) {
            vals[i][j] = (float)((i * 7 + j * 3) % 11) - 5.0f;
            want[j] += vals[i][j];
        }
    }
    y = sum_of_arrays(&g_ocl, (const float(*)[4])vals, INPUTS);
    ref = sum_of_arrays(&g_cpu, (const float(*)[4])vals, INPUTS);
    kernels = kernel_count(&y, 1);
    print_message("%d arrays: %d kernels\n", INPUTS, kernels);
    assert_true(kernels >= 2);
    assert_int_equal(tb_tensor_to_host(y, got, sizeof got), TB_OK);
    assert_int_equal(tb_tensor_to_host(ref, ref_got, sizeof ref_got), TB_OK);
    for (j = 0; j < 4; j++) {
        assert_true(ref_got[j] == want[j]); /* small integers: exact in any order */
        assert_true(got[j] == ref_got[j]);
    }
    tb_tensor_release(y);
    tb_tensor_release(ref);
}

/* The distance of two floats in units in the last place (0 for equal values, both NaN). */
static double ulps_apart(float a, float b) {
    int32_t ia, ib;
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b) ? 0 : 1e30;
    if (a == b) return 0;
    memcpy(&ia, &a, 4);
    memcpy(&ib, &b, 4);
    if (ia < 0) ia = (int32_t)(0x80000000u - (uint32_t)ia);
    if (ib < 0) ib = (int32_t)(0x80000000u - (uint32_t)ib);
    return fabs((double)ia - (double)ib);
}

/* exp of f32 rows read in order runs the kernels' own vector exp, and read otherwise the
   scalar one (native: the prelude's tb_exp_f32; OpenCL: the built-in): within 2 ulp of the C
   library's over the whole range, and exact at the edges (overflow to inf, underflow through the
   denormals to 0, inf, -inf, NaN). */
static void test_vector_exp(void **state) {
    enum { N = 1 << 16, SPECIAL = 14 };
    static const float special[SPECIAL] = {0.0f,     -0.0f,  1.0f,    -1.0f,  88.72f,
                                           88.7228f, 88.73f, -87.3f,  -95.0f, -103.9f,
                                           -104.0f,  200.0f, -200.0f, 1e-30f};
    static float in[N], got[N];
    tb_shape s = shp(TB_F32, 2, N / 64, 64, 0, 0);
    tb_tensor *x, *y;
    double worst = 0;
    int i, at = 0;
    (void)state;
    REQUIRE_OPENCL();
    for (i = 0; i < N; i++)
        in[i] = -110.0f + 200.0f * (float)i / (float)N;
    for (i = 0; i < SPECIAL; i++)
        in[i * 97] = special[i];
    in[5] = INFINITY;
    in[6] = -INFINITY;
    in[7] = NAN;
    x = tb_tensor_from_host(in, &s, &g_ocl);
    y = tb_exp(x);
    {
        char *text = tb_ir_backend_text(&y, 1); /* the kernel calls the vector exp */
        assert_non_null(text);
        assert_non_null(strstr(text, "= TB_VEXP(v"));
        tb_free(text);
    }
    assert_int_equal(tb_tensor_to_host(y, got, sizeof got), TB_OK);
    for (i = 0; i < N; i++) {
        double d = ulps_apart(got[i], expf(in[i]));
        if (d > worst) {
            worst = d;
            at = i;
        }
    }
    if (worst > 2)
        fail_msg("exp(%.9g) = %.9g, the C library says %.9g: %.0f ulp", (double)in[at],
                 (double)got[at], (double)expf(in[at]), worst);
    assert_true(isinf(got[5]) && got[5] > 0);
    assert_true(got[6] == 0.0f);
    assert_true(isnan(got[7]));
    tb_tensor_release(y);
    /* read transposed: the scalar exp of the prelude, as close */
    {
        tb_tensor *t = tb_transpose(x, 0, 1);
        char *text;
        y = tb_exp(t);
        text = tb_ir_backend_text(&y, 1);
        assert_non_null(text);
        if (strcmp(TEST_BACKEND, "native") == 0) assert_non_null(strstr(text, "tb_exp_f32(("));
        tb_free(text);
        assert_int_equal(tb_tensor_to_host(y, got, sizeof got), TB_OK);
        worst = 0;
        for (i = 0; i < N; i++) {
            int src = (i % (N / 64)) * 64 + i / (N / 64);
            double d = ulps_apart(got[i], expf(in[src]));
            if (d > worst) {
                worst = d;
                at = src;
            }
        }
        if (worst > 2)
            fail_msg("scalar exp(%.9g): %.0f ulp from the C library's %.9g", (double)in[at], worst,
                     (double)expf(in[at]));
        tb_tensor_release(y);
        tb_tensor_release(t);
    }
    tb_tensor_release(x);
}

/* The distance from `got` to the double `want` in f32 units in the last place of want. */
static double ulps_off(float got, double want) {
    float w = (float)fabs(want);
    double ulp = w < FLT_MIN ? ldexp(1.0, -149) : (double)nextafterf(w, INFINITY) - (double)w;
    if (isnan(got) || isnan(want)) return isnan(got) && isnan(want) ? 0 : 1e30;
    return fabs((double)got - want) / ulp;
}

/* f32 erf and gelu run the kernels' own polynomial (no call per element), as a vector where
   rows are read in order and as scalars where they are not (a transposed read): erf within 2
   ulp of double erf over [-6, 6], gelu within 10 ulp (1 + erf(z) cancels for z in (-1, 0):
   PyTorch's f32 gelu loses more there) or 5e-8 (below -5.6, where it is 0 for -3e-8), and exact at
   the edges: erf(+-inf) = +-1, gelu(inf) = inf, gelu(-inf) NaN (as the reference's -inf * 0), NaN
   stays NaN, -0 stays -0. */
static void test_erf_gelu_f32(void **state) {
    enum { R = 256, C = 256, N = R * C };
    static float in[N], got_e[N], got_g[N];
    tb_shape s = shp(TB_F32, 2, R, C, 0, 0);
    int i, t;
    (void)state;
    REQUIRE_OPENCL();
    for (i = 0; i < N; i++)
        in[i] = -6.0f + 12.0f * (float)i / (float)N;
    in[11] = INFINITY;
    in[12] = -INFINITY;
    in[13] = NAN;
    in[14] = -0.0f;
    in[15] = 1e-40f;
    for (t = 0; t < 2; t++) {
        tb_tensor *x = tb_tensor_from_host(in, &s, &g_ocl), *v = t ? tb_transpose(x, 0, 1) : x;
        tb_tensor *e = tb_erf(v), *g = tb_gelu(v);
        double worst_e = 0, worst_g = 0;
        char *text = tb_ir_backend_text(&e, 1);
        assert_non_null(text);
        assert_non_null(strstr(text, t ? "tb_erf_f32(" : "tb_verf(v"));
        tb_free(text);
        assert_int_equal(tb_tensor_to_host(e, got_e, sizeof got_e), TB_OK);
        assert_int_equal(tb_tensor_to_host(g, got_g, sizeof got_g), TB_OK);
        for (i = 0; i < N; i++) {
            int at = t ? (i % R) * C + i / R : i; /* the input element of output i */
            double xv = in[at], ge = 0.5 * xv * (1.0 + erf(xv / sqrt(2.0)));
            double de = ulps_off(got_e[i], erf(xv)), dg = ulps_off(got_g[i], ge);
            if (isinf(xv)) continue;
            if (de > 2)
                fail_msg("%s: erf(%.9g) = %.9g, want %.9g: %.1f ulp", t ? "scalar" : "vector", xv,
                         (double)got_e[i], erf(xv), de);
            if (dg > 10 && fabs((double)got_g[i] - ge) > 5e-8)
                fail_msg("%s: gelu(%.9g) = %.9g, want %.9g: %.1f ulp", t ? "scalar" : "vector", xv,
                         (double)got_g[i], ge, dg);
            worst_e = de > worst_e ? de : worst_e;
            if (fabs(ge) > 1e-6) worst_g = dg > worst_g ? dg : worst_g;
        }
        assert_true(got_e[t ? 11 * R : 11] == 1.0f && got_e[t ? 12 * R : 12] == -1.0f);
        assert_true(isinf(got_g[t ? 11 * R : 11]) && isnan(got_g[t ? 12 * R : 12]));
        assert_true(isnan(got_e[t ? 13 * R : 13]) && isnan(got_g[t ? 13 * R : 13]));
        assert_true(got_e[t ? 14 * R : 14] == 0.0f && signbit(got_e[t ? 14 * R : 14]));
        print_message("%s: erf within %.2f ulp, gelu %.2f\n", t ? "scalar" : "vector", worst_e,
                      worst_g);
        tb_tensor_release(e);
        tb_tensor_release(g);
        if (v != x) tb_tensor_release(v);
        tb_tensor_release(x);
    }
}

/* A where whose condition is a bool buffer reads it as W bytes at once in a row kernel (a
   masked softmax, as attention's causal mask, and an elementwise where with the mask
   broadcast down the rows), with the reference's values: masked lanes take the other
   operand, also where it is -inf or NaN. */
static void test_vector_where_mask(void **state) {
    enum { R = 48, C = 128 };
    static float xv[R * C], got[R * C], want[R * C];
    static unsigned char m2[R * C], m1[C];
    tb_shape xs = shp(TB_F32, 2, R, C, 0, 0), s2 = shp(TB_BOOL, 2, R, C, 0, 0);
    tb_shape s1 = shp(TB_BOOL, 1, C, 0, 0, 0), one = shp(TB_F32, 0, 0, 0, 0, 0);
    const tb_device *devs[2] = {&g_cpu, &g_ocl};
    int i, c, d;
    (void)state;
    REQUIRE_OPENCL();
    for (i = 0; i < R * C; i++) {
        xv[i] = (float)((i * 37) % 101) / 25.0f - 2.0f;
        m2[i] = (unsigned char)((i * 7) % 5 != 0);
    }
    for (i = 0; i < C; i++)
        m1[i] = (unsigned char)(i % 3 != 1);
    xv[5] = NAN;
    m2[5] = 0;
    for (c = 0; c < 2; c++) {
        for (d = 0; d < 2; d++) {
            float ninf = -INFINITY;
            tb_tensor *x = tb_tensor_from_host(xv, &xs, devs[d]);
            tb_tensor *m =
                c ? tb_tensor_from_host(m1, &s1, devs[d]) : tb_tensor_from_host(m2, &s2, devs[d]);
            tb_tensor *f = tb_tensor_from_host(&ninf, &one, devs[d]);
            tb_tensor *sx = tb_mul_scalar(x, 0.5), *w = tb_where(m, sx, f), *y;
            y = c ? tb_softmax(w, 1) : tb_relu(w);
            assert_non_null(y);
            if (d == 1) {
                char *text = tb_ir_backend_text(&y, 1);
                assert_non_null(text);
                assert_non_null(strstr(text, "= TB_VLDB(b"));
                tb_free(text);
            }
            assert_int_equal(tb_tensor_to_host(y, d ? got : want, sizeof got), TB_OK);
            tb_tensor_release(y);
            tb_tensor_release(w);
            tb_tensor_release(sx);
            tb_tensor_release(f);
            tb_tensor_release(m);
            tb_tensor_release(x);
        }
        for (i = 0; i < R * C; i++)
            if (!(got[i] == want[i] || fabsf(got[i] - want[i]) <= 1e-6f * fabsf(want[i]) ||
                  (isnan(got[i]) && isnan(want[i]))))
                fail_msg("%s: element %d is %.9g, the reference's %.9g",
                         c ? "masked softmax" : "where", i, (double)got[i], (double)want[i]);
    }
}

/* Whether generated code has a non-temporal store (not just the macro's definition). */
static bool streams(const char *text) {
    const char *p;
    for (p = strstr(text, "TB_VSTREAM("); p != NULL; p = strstr(p + 1, "TB_VSTREAM("))
        if (strncmp(p + 11, "v, p)", 5) != 0) return true;
    return false;
}

/* The rows a pipelined softmax's work item takes (tb_r0 = tb_c * N in its kernel), 0 if none. */
static long pipe_chunk(const char *text) {
    const char *p = strstr(text, "tb_r0 = tb_c * ");
    return p != NULL ? strtol(p + 15, NULL, 10) : 0;
}

/* Norms over long f32 rows of a large output: the second pass over each row prefetches the
   next one and the last pass stores past the caches (non-temporal stores, then a fence), where
   every store is a whole aligned vector; values as the reference's either way. A row length
   that is not a multiple of the vector, or an x computed in the kernel, keeps plain stores or
   no prefetch. A softmax without an epilogue is pipelined (a work item per chunk of rows, each
   row streamed out while the next is computed) where two rows fit its private buffer; with
   longer rows it keeps its exponentials in the output and scales them in place. */
static void test_norm_rows_streamed(void **state) {
    enum { ROWS = 2048, COLS = 4096, ODD = 4102 }; /* ODD: no multiple of any vector width */
    const size_t n = (size_t)ROWS * ODD;
    float *host = (float *)malloc(n * sizeof(float)), *spec = (float *)malloc(n * sizeof(float)),
          *wb = (float *)malloc(2 * ODD * sizeof(float));
    tb_shape s = shp(TB_F32, 2, ROWS, COLS, 0, 0), so = shp(TB_F32, 2, ROWS, ODD, 0, 0),
             sw = shp(TB_F32, 1, COLS, 0, 0, 0), s1 = shp(TB_F32, 2, ROWS + 1, COLS, 0, 0),
             s16k = shp(TB_F32, 2, ROWS / 4, 4 * COLS, 0, 0),
             s8k = shp(TB_F32, 2, ROWS / 2, 2 * COLS, 0, 0);
    size_t i;
    int c;
    (void)state;
    REQUIRE_OPENCL();
    assert_non_null(host);
    assert_non_null(spec);
    assert_non_null(wb);
    for (i = 0; i < n; i++)
        host[i] = (float)(rnd_unit() * 8.0 - 4.0);
    for (i = 0; i < 2 * ODD; i++)
        wb[i] = (float)(rnd_unit() * 2.0 - 1.0);
    /* rows of s1 with what a softmax must keep, where the pipeline turns: a NaN in row 0 (the
       first of the first chunk), every element -inf at the end of each chunk, +inf in the
       first row of each later chunk, large values in the last row (of a shorter last chunk) */
    {
        tb_tensor *px = tb_tensor_from_host(host, &s1, &g_ocl), *py = tb_softmax(px, 1);
        char *ptext;
        long chunk;
        size_t r;
        assert_non_null(py);
        ptext = tb_ir_backend_text(&py, 1);
        assert_non_null(ptext);
        chunk = pipe_chunk(ptext);
        tb_free(ptext);
        tb_tensor_release(py);
        tb_tensor_release(px);
        assert_true(chunk >= 1);
        memcpy(spec, host, n * sizeof(float));
        spec[17] = NAN;
        for (r = (size_t)chunk - 1; r < ROWS; r += (size_t)chunk) {
            for (i = 0; i < COLS; i++)
                spec[r * COLS + i] = -INFINITY;
            if (r + 1 < ROWS) spec[(r + 1) * COLS + 4000] = INFINITY;
        }
        for (i = 0; i < COLS; i++)
            spec[(size_t)ROWS * COLS + i] = 80.0f + (float)(i % 7);
    }
    for (c = 0; c < 11; c++) {
        /* 0 layer_norm, 1 log_softmax, 2 softmax * 2 (an epilogue), 3 softmax (pipelined: a
           work item per chunk of rows, exponentials in a private buffer, the previous row
           streamed out while the next is computed), 4 layer_norm of rows of ODD, 5 layer_norm
           of exp(x) (computed in the kernel), 6 exp(x) * 2 + w (elementwise: streamed on
           native, which fences once per range of items; OpenCL C has no such point),
           7 softmax of 2049 rows with NaN and infinities (a short last chunk), 8 softmax of
           x * 0.5 (computed: pipelined, nothing to prefetch), 9 softmax of rows of 16384 (two
           rows too large for the private buffer: exponentials kept in out, not streamed),
           10 softmax of rows of 8192 (the largest private buffer) */
        const tb_shape *xs = c == 4 ? &so : c == 7 ? &s1 : c == 9 ? &s16k : c == 10 ? &s8k : &s;
        const bool pipe = c == 3 || c == 7 || c == 8 || c == 10;
        tb_tensor *x[2], *w[2], *b[2], *y[2];
        char *text, what[64];
        int d;
        for (d = 0; d < 2; d++) {
            const tb_device *dev = d ? &g_ocl : &g_cpu;
            x[d] = tb_tensor_from_host(c == 7 ? spec : host, xs, dev);
            w[d] = tb_tensor_from_host(wb, &sw, dev);
            b[d] = tb_tensor_from_host(wb + ODD, &sw, dev);
            if (c == 0) {
                y[d] = tb_layer_norm(x[d], 1, w[d], b[d], 1e-5);
            } else if (c == 1) {
                y[d] = tb_log_softmax(x[d], 1);
            } else if (c == 2) {
                tb_tensor *sm = tb_softmax(x[d], 1);
                y[d] = tb_mul_scalar(sm, 2.0);
                tb_tensor_release(sm);
            } else if (c == 3 || c == 7 || c == 9 || c == 10) {
                y[d] = tb_softmax(x[d], 1);
            } else if (c == 4) {
                y[d] = tb_layer_norm(x[d], 1, NULL, NULL, 1e-5);
            } else if (c == 5) {
                tb_tensor *e = tb_exp(x[d]);
                y[d] = tb_layer_norm(e, 1, w[d], b[d], 1e-5);
                tb_tensor_release(e);
            } else if (c == 6) {
                tb_tensor *e = tb_exp(x[d]), *e2 = tb_mul_scalar(e, 2.0);
                y[d] = tb_add(e2, w[d]);
                tb_tensor_release(e);
                tb_tensor_release(e2);
            } else {
                tb_tensor *h = tb_mul_scalar(x[d], 0.5);
                y[d] = tb_softmax(h, 1);
                tb_tensor_release(h);
            }
            assert_non_null(y[d]);
        }
        text = tb_ir_backend_text(&y[1], 1);
        assert_non_null(text);
        if (c == 4 || c == 9 || (c == 6 && TEST_OPENCL)) {
            assert_false(streams(text));
        } else {
            assert_true(streams(text));
            assert_non_null(strstr(text, "TB_VSTREAM_END();"));
        }
        assert_true((strstr(text, "tb_scr[") != NULL) == pipe);
        if (TEST_OPENCL) check_kernel_names("streamed norm", text);
        if (c == 3 || c == 7 || c == 10) {
            assert_non_null(strstr(text, "TB_PREFETCH_L2(b0 + "));
        } else if (c <= 4 || c == 9) {
            assert_non_null(strstr(text, "TB_PREFETCH(b0 + "));
        } else {
            assert_null(strstr(text, "TB_PREFETCH(b"));
            assert_null(strstr(text, "TB_PREFETCH_L2(b"));
        }
        tb_free(text);
        snprintf(what, sizeof what, "streamed norm case %d", c);
        compare_tensors(what, y[0], y[1]);
        for (d = 0; d < 2; d++) {
            tb_tensor_release(x[d]);
            tb_tensor_release(w[d]);
            tb_tensor_release(b[d]);
            tb_tensor_release(y[d]);
        }
    }
    free(host);
    free(spec);
    free(wb);
}

static void test_max_min_nan_large(void **state) {
    const size_t n = (size_t)1 << 20;
    tb_shape s = shp(TB_F32, 1, (int64_t)n, 0, 0, 0);
    float *a = (float *)malloc(n * sizeof(float));
    size_t nan_at[3], i;
    int round, op;
    (void)state;
    REQUIRE_OPENCL();
    assert_non_null(a);
    nan_at[0] = 0;
    nan_at[1] = n / 2 + 3;
    nan_at[2] = n - 1;
    for (round = 0; round < 5; round++) {
        float want_max = -INFINITY, want_min = INFINITY;
        for (i = 0; i < n; i++) {
            a[i] = (float)(rnd_unit() * 2000.0 - 1000.0);
            if (a[i] > want_max) want_max = a[i];
            if (a[i] < want_min) want_min = a[i];
        }
        if (round < 3) a[nan_at[round]] = NAN;
        if (round == 4) {
            for (i = 0; i < n; i++)
                a[i] = -INFINITY;
            want_max = -INFINITY;
            want_min = -INFINITY;
        }
        for (op = 0; op < 2; op++) {
            tb_tensor *x = tb_tensor_from_host(a, &s, &g_ocl);
            tb_tensor *y = op == 0 ? tb_max(x, NULL, 0, false) : tb_min(x, NULL, 0, false);
            float got = 0;
            assert_non_null(y);
            assert_int_equal(tb_tensor_to_host(y, &got, sizeof got), TB_OK);
            if (round < 3) {
                if (!isnan(got)) fail_msg("round %d op %d: got %g, want NaN", round, op, got);
            } else {
                assert_true(got == (op == 0 ? want_max : want_min));
            }
            tb_tensor_release(y);
            tb_tensor_release(x);
        }
    }
    free(a);
}

/* ---- tb_ir_dot: the kernels drawn as clusters ---- */

/* Checks a DOT dump: every node declared once; when `clusters`, every computed node (no
   "param" in its label) inside exactly one "subgraph cluster_" and no parameter in one.
   Fills `decl` with the node declarations without their indentation, one per line, sorted by
   node id, and `labels` with the cluster labels. */
static void check_dot(const char *dot, bool clusters, char *decl, size_t decl_cap, char *labels,
                      size_t labels_cap) {
    const char *line = dot;
    bool in_cluster = false;
    int cluster_nodes = 0, num_clusters = 0, seen[256];
    char decls[256][160];
    int max_id = -1, i;
    memset(seen, 0, sizeof seen);
    decl[0] = '\0';
    labels[0] = '\0';
    assert_non_null(strstr(dot, "digraph tb {"));
    while (*line != '\0') {
        const char *end = strchr(line, '\n');
        size_t len = end != NULL ? (size_t)(end - line) : strlen(line);
        const char *t = line;
        int id;
        while (*t == ' ')
            t++;
        if (strncmp(t, "subgraph cluster_", 17) == 0) {
            assert_true(clusters);
            assert_false(in_cluster);
            in_cluster = true;
            cluster_nodes = 0;
            num_clusters++;
        } else if (in_cluster && strncmp(t, "label=\"", 7) == 0) {
            const char *q = strchr(t + 7, '"');
            assert_non_null(q);
            assert_true(q > t + 7); /* a name */
            assert_true(strlen(labels) + (size_t)(q - (t + 7)) + 2 < labels_cap);
            strncat(labels, t + 7, (size_t)(q - (t + 7)));
            strcat(labels, " ");
        } else if (in_cluster && t[0] == '}') {
            assert_true(cluster_nodes > 0); /* no empty cluster */
            in_cluster = false;
        } else if (t[0] == 'n' && strstr(t, " [label=") != NULL &&
                   strstr(t, " [label=") < line + len && sscanf(t, "n%d", &id) == 1) {
            size_t n = len - (size_t)(t - line);
            bool param = strstr(t, "\\nparam ") != NULL && strstr(t, "\\nparam ") < line + len;
            assert_true(id >= 0 && id < 256);
            assert_int_equal(seen[id], 0); /* declared once */
            seen[id] = 1;
            if (id > max_id) max_id = id;
            assert_true(n < sizeof decls[0]);
            memcpy(decls[id], t, n);
            decls[id][n] = '\0';
            if (clusters) {
                /* computed nodes in a cluster, parameters outside */
                if (param) {
                    assert_false(in_cluster);
                } else {
                    assert_true(in_cluster);
                }
            }
            if (in_cluster) cluster_nodes++;
        }
        line = end != NULL ? end + 1 : line + len;
    }
    assert_false(in_cluster);
    if (clusters) assert_true(num_clusters > 0);
    for (i = 0; i <= max_id; i++) {
        assert_int_equal(seen[i], 1); /* ids 0..max, each once */
        assert_true(strlen(decl) + strlen(decls[i]) + 2 < decl_cap);
        strcat(decl, decls[i]);
        strcat(decl, "\n");
    }
}

/* The edge lines of a DOT dump, in order. */
static void edge_lines(const char *dot, char *out, size_t cap) {
    const char *line = dot;
    out[0] = '\0';
    while (*line != '\0') {
        const char *end = strchr(line, '\n');
        size_t len = end != NULL ? (size_t)(end - line + 1) : strlen(line);
        const char *arrow = strstr(line, " -> ");
        if (arrow != NULL && arrow < line + len) {
            assert_true(strlen(out) + len + 1 < cap);
            strncat(out, line, len);
        }
        line += len;
    }
}

static tb_tensor *build_mlp_softmax(const tb_device *dev, const float *a, const float *w,
                                    const float *b, tb_tensor **hidden) {
    tb_shape sa = shp(TB_F32, 2, 6, 5, 0, 0), sw = shp(TB_F32, 2, 5, 3, 0, 0),
             sb = shp(TB_F32, 1, 3, 0, 0, 0);
    tb_tensor *x = tb_tensor_from_host(a, &sa, dev), *wt = tb_tensor_from_host(w, &sw, dev),
              *bt = tb_tensor_from_host(b, &sb, dev), *h, *y;
    h = tb_matmul(x, wt);
    h = take(h, tb_add(h, bt));
    h = take(h, tb_relu(h));
    y = tb_softmax(h, -1);
    assert_non_null(y);
    tb_tensor_release(x);
    tb_tensor_release(wt);
    tb_tensor_release(bt);
    *hidden = h;
    return y;
}

/* ---- an allocator hook ---- */

/* Counts live blocks and refuses the call numbered g_hook_fail_at (counted from 0 at arming;
   -1: none). Each block has a header in front, so a block given to the default allocator's
   free is caught by the address sanitizer. */
#define HOOK_HEADER 32
static long g_hook_live, g_hook_calls, g_hook_fail_at = -1, g_hook_refused;

static void *hook_alloc(size_t size, void *user_data) {
    unsigned char *p;
    long call = __atomic_fetch_add(&g_hook_calls, 1, __ATOMIC_RELAXED);
    (void)user_data;
    if (call == __atomic_load_n(&g_hook_fail_at, __ATOMIC_RELAXED)) {
        __atomic_add_fetch(&g_hook_refused, 1, __ATOMIC_RELAXED);
        return NULL;
    }
    p = (unsigned char *)malloc(size + HOOK_HEADER);
    if (p == NULL) return NULL;
    __atomic_add_fetch(&g_hook_live, 1, __ATOMIC_RELAXED);
    return p + HOOK_HEADER;
}

static void hook_free(void *ptr, void *user_data) {
    (void)user_data;
    __atomic_sub_fetch(&g_hook_live, 1, __ATOMIC_RELAXED);
    free((unsigned char *)ptr - HOOK_HEADER);
}

static void hook_arm(long fail_at) {
    __atomic_store_n(&g_hook_fail_at, -1, __ATOMIC_RELAXED);
    __atomic_store_n(&g_hook_calls, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&g_hook_refused, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&g_hook_fail_at, fail_at, __ATOMIC_RELAXED);
}

/* A new session whose allocations go through the hook. */
static void hook_session(void) {
    tb_desc desc;
    tb_shutdown();
    hook_arm(-1);
    g_hook_live = 0;
    memset(&desc, 0, sizeof desc);
    desc.allocator.alloc = hook_alloc;
    desc.allocator.free = hook_free;
    assert_int_equal(tb_setup(&desc), TB_OK);
}

static void test_dot_clusters(void **state) {
    float a[30], w[15], b[3];
    tb_shape sa = shp(TB_F32, 2, 6, 5, 0, 0), sw = shp(TB_F32, 2, 5, 3, 0, 0),
             sb = shp(TB_F32, 1, 3, 0, 0, 0);
    tb_tensor *y, *h, *yc, *hc, *pair[2];
    char *dot, *plain, decl[8192], decl_cpu[8192], labels[512], labels_cpu[512];
    float got[18];
    int variant;
    (void)state;
    REQUIRE_OPENCL();
    fill(a, &sa, R_ANY, 0);
    fill(w, &sw, R_ANY, 0);
    fill(b, &sb, R_ANY, 0);
    for (variant = 0; variant < 2; variant++) {
        /* 0: the softmax alone; 1: the hidden layer is a result too */
        size_t n = variant == 0 ? 1 : 2;
        y = build_mlp_softmax(&g_ocl, a, w, b, &h);
        yc = build_mlp_softmax(&g_cpu, a, w, b, &hc);
        pair[0] = y;
        pair[1] = h;
        tb_clear_error();
        dot = tb_ir_dot(pair, n);
        assert_non_null(dot);
        assert_int_equal(tb_last_status(), TB_OK);
        check_dot(dot, true, decl, sizeof decl, labels, sizeof labels);
        assert_non_null(strstr(dot, "label=\"MM_6_3_5"));
        assert_non_null(strstr(dot, "label=\"S_6_3"));
        assert_non_null(strstr(labels, "MM_6_3_5"));
        assert_non_null(strstr(labels, "S_6_3"));
        /* the cpu backend draws no cluster; the nodes are the same, with the same labels */
        pair[0] = yc;
        pair[1] = hc;
        plain = tb_ir_dot(pair, n);
        assert_non_null(plain);
        assert_null(strstr(plain, "cluster"));
        assert_null(strstr(plain, "subgraph"));
        check_dot(plain, false, decl_cpu, sizeof decl_cpu, labels_cpu, sizeof labels_cpu);
        assert_string_equal(decl, decl_cpu);
        /* the edges too */
        {
            char edges[4096], edges_cpu[4096];
            edge_lines(dot, edges, sizeof edges);
            edge_lines(plain, edges_cpu, sizeof edges_cpu);
            assert_true(strlen(edges) > 0);
            assert_string_equal(edges, edges_cpu);
        }
        tb_free(dot);
        tb_free(plain);
        /* drawing the dump compiled the graph that runs now (and does not change the values) */
        assert_int_equal(tb_tensor_to_host(y, got, sizeof got), TB_OK);
        tb_tensor_release(y);
        tb_tensor_release(h);
        tb_tensor_release(yc);
        tb_tensor_release(hc);
    }
    /* a dump of parameters only has no kernel: no cluster */
    {
        tb_tensor *x = tb_tensor_from_host(a, &sa, &g_ocl);
        dot = tb_ir_dot(&x, 1);
        assert_non_null(dot);
        assert_null(strstr(dot, "cluster"));
        tb_free(dot);
        tb_tensor_release(x);
    }
}

static char *dump_of(int which, tb_tensor *y) {
    switch (which) {
    case 0:
        return tb_ir_text(&y, 1);
    case 1:
        return tb_ir_dot(&y, 1);
    case 2:
        return tb_ir_backend_text(&y, 1);
    default:
        return tb_backend_metrics_report("opencl");
    }
}

/* Under a refused allocation anywhere, each dump of a graph that compiles (cached), and the
   backend's metrics report, is either complete, clusters included, or NULL with an error: the
   DOT used to lose its clusters silently, the report used to be empty. */
static void test_dumps_under_allocation_failures(void **state) {
    float a[30], w[15], b[3];
    tb_shape sa = shp(TB_F32, 2, 6, 5, 0, 0), sw = shp(TB_F32, 2, 5, 3, 0, 0),
             sb = shp(TB_F32, 1, 3, 0, 0, 0);
    tb_tensor *y, *h;
    int which;
    (void)state;
    REQUIRE_OPENCL();
    fill(a, &sa, R_ANY, 0);
    fill(w, &sw, R_ANY, 0);
    fill(b, &sb, R_ANY, 0);
    hook_session();
    y = build_mlp_softmax(&g_ocl, a, w, b, &h);
    for (which = 0; which < 4; which++) {
        char *expected = dump_of(which, y);
        long k;
        assert_non_null(expected);
        if (which == 1) assert_non_null(strstr(expected, "subgraph cluster"));
        for (k = 0;; k++) {
            char *text;
            bool refused;
            tb_clear_error();
            hook_arm(k);
            text = dump_of(which, y);
            refused = g_hook_refused != 0;
            hook_arm(-1);
            if (text == NULL && tb_last_status() == TB_OK) {
                fail_msg("dump %d, allocation %ld refused: NULL without an error", which, k);
            }
            if (text != NULL && (strcmp(text, expected) != 0 || tb_last_status() != TB_OK)) {
                fail_msg("dump %d, allocation %ld refused: an incomplete text (error '%s'):\n%s",
                         which, k, tb_last_error(), text);
            }
            tb_free(text);
            if (!refused) break; /* past the last allocation */
        }
        assert_true(k > 1);
        tb_free(expected);
    }
    tb_tensor_release(y);
    tb_tensor_release(h);
    tb_shutdown();
    assert_int_equal(tb_setup(NULL), TB_OK);
    probe();
}

/* A graph that does not compile is drawn without clusters, and the dump reports no error. */
static void test_dot_compile_error_plain(void **state) {
    tb_custom_op_desc d;
    tb_op op;
    float a[4] = {1, 2, 3, 4};
    tb_shape s = shp(TB_F32, 1, 4, 0, 0, 0);
    tb_tensor *x, *y, *z;
    char *dot;
    (void)state;
    REQUIRE_OPENCL();
    memset(&d, 0, sizeof d);
    d.name = "ocl_broken";
    d.num_inputs = 1;
    d.reference = copy_reference;
    d.opencl_expr = "x0 +* no_such_name";
    if (tb_op_lookup("ocl_broken", &op) != TB_OK) assert_int_equal(tb_op_register(&d, &op), TB_OK);
    x = tb_tensor_from_host(a, &s, &g_ocl);
    y = tb_call_op(op, &x, 1, NULL, 0);
    z = tb_exp(y);
    assert_non_null(z);
    tb_clear_error();
    dot = tb_ir_dot(&z, 1);
    assert_non_null(dot);
    assert_int_equal(tb_last_status(), TB_OK);
    assert_null(strstr(dot, "cluster"));
    assert_non_null(strstr(dot, "ocl_broken"));
    assert_non_null(strstr(dot, "exp"));
    tb_free(dot);
    tb_tensor_release(z);
    tb_tensor_release(y);
    tb_tensor_release(x);
}

/* ---- scalars are parameters ---- */

static void test_scalars_do_not_recompile(void **state) {
    float a[8] = {1, 2, 3, 4, 5, 6, 7, 8}, got[8];
    tb_shape s = shp(TB_F32, 1, 8, 0, 0, 0);
    tb_tensor *x;
    int i, k;
    (void)state;
    REQUIRE_OPENCL();
    x = tb_tensor_from_host(a, &s, &g_ocl);
    tb_metrics_reset();
    for (k = 0; k < 3; k++) {
        tb_tensor *y = tb_mul_scalar(x, (double)k + 0.5);
        y = take(y, tb_add_scalar(y, -(double)k));
        assert_int_equal(tb_tensor_to_host(y, got, sizeof got), TB_OK);
        for (i = 0; i < 8; i++)
            assert_true(got[i] == a[i] * ((float)k + 0.5f) - (float)k);
        tb_tensor_release(y);
    }
    assert_int_equal(tb_metrics_counter("UncachedCompile"), 1);
    assert_int_equal(tb_metrics_counter("CachedCompile"), 2);
    /* many scalars (more than a device may take as kernel arguments) */
    tb_metrics_reset();
    for (k = 0; k < 2; k++) {
        tb_tensor *y = tb_tensor_retain(x);
        float expect[8];
        int j;
        for (i = 0; i < 8; i++)
            expect[i] = a[i];
        for (j = 0; j < 40; j++) {
            double m = 1.0 + (double)(j + k) / 64.0, c = (double)j / 1024.0;
            y = take(y, tb_mul_scalar(y, m));
            y = take(y, tb_add_scalar(y, c));
            for (i = 0; i < 8; i++)
                expect[i] = expect[i] * (float)m + (float)c;
        }
        assert_int_equal(tb_tensor_to_host(y, got, sizeof got), TB_OK);
        for (i = 0; i < 8; i++)
            assert_true(got[i] == expect[i]);
        tb_tensor_release(y);
    }
    assert_int_equal(tb_metrics_counter("UncachedCompile"), 1);
    assert_int_equal(tb_metrics_counter("CachedCompile"), 1);
    tb_tensor_release(x);
}

/* ---- seeded random graphs ---- */

#define POOL 12

typedef struct rg_state {
    tb_tensor *pool[POOL];
    int n;
} rg_state;

static int64_t rg_numel(tb_tensor *t) {
    tb_shape s = tb_tensor_shape(t);
    return (int64_t)numel_of(&s);
}

/* A new input whose shape broadcasts against `s`: each dim kept or set to 1, leading dims
   dropped at random. */
static tb_shape rg_broadcast_shape(const tb_shape *s) {
    tb_shape r;
    int32_t drop = s->rank > 0 ? (int32_t)rnd_int(0, s->rank > 1 ? 1 : 0) : 0, i;
    memset(&r, 0, sizeof r);
    r.dtype = s->dtype;
    r.rank = s->rank - drop;
    for (i = 0; i < r.rank; i++)
        r.dims[i] = (rnd_u32() % 3 == 0) ? 1 : s->dims[i + drop];
    return r;
}

/* The graph builder: one step on the pool, deterministic from the seed; `inputs` lists host
   inputs made along the way so that the cpu and opencl graphs read the same values. */
typedef struct rg_input {
    tb_shape shape;
    void *data;
} rg_input;

typedef struct rg_script {
    rg_input inputs[64];
    int num_inputs;
    uint32_t choices[512];
    int num_choices, next;
    bool wide; /* rows of 32 to 96 elements, wide enough for the kernels' vector code */
} rg_script;

static uint32_t rg_pick(rg_script *sc, uint32_t n) {
    uint32_t v;
    if (sc->next < sc->num_choices) {
        v = sc->choices[sc->next++];
    } else {
        v = rnd_u32();
        if (sc->num_choices < 512) sc->choices[sc->num_choices++] = v;
        sc->next++;
    }
    return n == 0 ? 0 : v % n;
}

static tb_tensor *rg_input_tensor(rg_script *sc, int *input_at, const tb_shape *shape,
                                  const tb_device *dev, int range) {
    rg_input *in;
    if (*input_at < sc->num_inputs) {
        in = &sc->inputs[(*input_at)++];
    } else {
        in = &sc->inputs[sc->num_inputs++];
        (*input_at)++;
        in->shape = *shape;
        in->data = host_alloc(shape);
        fill(in->data, shape, range, 0);
    }
    return tb_tensor_from_host(in->data, &in->shape, dev);
}

/* Builds one random graph on `dev`; the same script replays the same graph. */
static tb_tensor *rg_build(rg_script *sc, const tb_device *dev, int steps) {
    tb_tensor *pool[POOL];
    int n = 0, input_at = 0, step, i;
    tb_tensor *result;
    sc->next = 0;
    {
        tb_shape s;
        int32_t rank = (int32_t)rg_pick(sc, sc->wide ? 3 : 4) + 1;
        memset(&s, 0, sizeof s);
        s.dtype = TB_F32;
        s.rank = rank;
        for (i = 0; i < rank; i++)
            s.dims[i] = (int64_t)rg_pick(sc, 5) + 1;
        if (sc->wide) { /* several rows each (a work item per row), 32 to 96 long */
            for (i = 0; i < rank - 1; i++)
                s.dims[i] += 3;
            s.dims[rank - 1] = 32 * ((int64_t)rg_pick(sc, 3) + 1);
        }
        pool[n++] = rg_input_tensor(sc, &input_at, &s, dev, R_ANY);
    }
    for (step = 0; step < steps; step++) {
        tb_tensor *x = pool[rg_pick(sc, (uint32_t)n)], *y = NULL;
        tb_shape xs;
        uint32_t op = rg_pick(sc, 24);
        if (sc->wide && rg_pick(sc, 2)) x = pool[n - 1]; /* chains: a reduction of a broadcast */
        if (sc->wide && op >= 20) op = op % 2 ? 3 : 10;
        xs = tb_tensor_shape(x);
        tb_clear_error();
        switch (op) {
        case 0:
            y = tb_tanh(x);
            break;
        case 1:
            y = tb_sigmoid(x);
            break;
        case 2:
            y = tb_mul_scalar(x, 0.5 + (double)rg_pick(sc, 4));
            break;
        case 3: { /* binary with a new broadcasting input */
            tb_shape bs = rg_broadcast_shape(&xs);
            tb_tensor *b;
            if (sc->wide && bs.rank > 0 && rg_pick(sc, 2)) bs.dims[bs.rank - 1] = 1; /* per row */
            b = rg_input_tensor(sc, &input_at, &bs, dev, R_ANY);
            uint32_t which = rg_pick(sc, 4);
            y = which == 0   ? tb_add(x, b)
                : which == 1 ? tb_mul(x, b)
                : which == 2 ? tb_sub(b, x)
                             : tb_maximum(x, b);
            tb_tensor_release(b);
            break;
        }
        case 4: { /* binary with a pool member of the same shape, else with itself */
            tb_tensor *o = x;
            for (i = 0; i < n; i++) {
                tb_shape os = tb_tensor_shape(pool[i]);
                if (pool[i] != x && tb_shape_equal(&os, &xs)) o = pool[i];
            }
            y = rg_pick(sc, 2) ? tb_add(x, o) : tb_mul(x, o);
            break;
        }
        case 5: /* permute */
            if (xs.rank >= 2) {
                int32_t perm[TB_MAX_RANK];
                for (i = 0; i < xs.rank; i++)
                    perm[i] = i;
                for (i = xs.rank - 1; i > 0; i--) {
                    int32_t j = (int32_t)rg_pick(sc, (uint32_t)i + 1), t = perm[i];
                    perm[i] = perm[j];
                    perm[j] = t;
                }
                y = tb_permute(x, perm, xs.rank);
            }
            break;
        case 6: /* slice */
            if (xs.rank >= 1) {
                int32_t d = (int32_t)rg_pick(sc, (uint32_t)xs.rank);
                if (xs.dims[d] >= 2) {
                    int64_t start = (int64_t)rg_pick(sc, (uint32_t)(xs.dims[d] - 1));
                    y = tb_slice(x, d, start, xs.dims[d], (int64_t)rg_pick(sc, 2) + 1);
                }
            }
            break;
        case 7: /* flip */
            if (xs.rank >= 1) {
                int32_t d = (int32_t)rg_pick(sc, (uint32_t)xs.rank);
                y = tb_flip(x, &d, 1);
            }
            break;
        case 8: { /* reshape: flatten, or merge two dims, or split one */
            int64_t dims[TB_MAX_RANK];
            int32_t r = 0;
            uint32_t how = rg_pick(sc, 3);
            if (how == 0 || xs.rank < 2) {
                dims[r++] = rg_numel(x);
            } else if (how == 1) {
                int32_t d = (int32_t)rg_pick(sc, (uint32_t)xs.rank - 1);
                for (i = 0; i < xs.rank; i++) {
                    if (i == d) {
                        dims[r++] = xs.dims[i] * xs.dims[i + 1];
                        i++;
                    } else {
                        dims[r++] = xs.dims[i];
                    }
                }
            } else {
                for (i = 0; i < xs.rank; i++)
                    dims[r++] = xs.dims[i];
                if (r < 4) dims[r++] = 1;
            }
            y = tb_reshape(x, dims, r);
            break;
        }
        case 9: /* expand a size-1 dim or add a leading dim */
            if (xs.rank < 4) {
                int64_t dims[TB_MAX_RANK];
                dims[0] = (int64_t)rg_pick(sc, 3) + 1;
                for (i = 0; i < xs.rank; i++)
                    dims[i + 1] = xs.dims[i] == 1 ? 3 : xs.dims[i];
                y = tb_expand(x, dims, xs.rank + 1);
            }
            break;
        case 16:
        case 17:
            y = tb_cos(x);
            break;
        case 18:
            y = tb_add_scalar(x, -0.25);
            break;
        case 19:
            y = tb_neg(x);
            break;
        case 10: /* reduction */
            if (xs.rank >= 1) {
                int32_t axis = (int32_t)rg_pick(sc, (uint32_t)xs.rank);
                uint32_t which = rg_pick(sc, 4);
                if (sc->wide && rg_pick(sc, 2)) axis = xs.rank - 1; /* along the row */
                bool keep = rg_pick(sc, 2) != 0;
                y = which == 0   ? tb_sum(x, &axis, 1, keep)
                    : which == 1 ? tb_mean(x, &axis, 1, keep)
                    : which == 2 ? tb_max(x, &axis, 1, keep)
                                 : tb_min(x, NULL, 0, keep);
            }
            break;
        case 11: /* softmax */
            if (xs.rank >= 1) y = tb_softmax(x, (int32_t)rg_pick(sc, (uint32_t)xs.rank));
            break;
        case 12: /* matmul with a new weight */
            if (xs.rank >= 1 && xs.rank <= 3) {
                tb_shape ws;
                tb_tensor *w;
                memset(&ws, 0, sizeof ws);
                ws.dtype = TB_F32;
                ws.rank = 2;
                ws.dims[0] = xs.dims[xs.rank - 1];
                ws.dims[1] = (int64_t)rg_pick(sc, 6) + 1;
                w = rg_input_tensor(sc, &input_at, &ws, dev, R_ANY);
                y = tb_matmul(x, w);
                tb_tensor_release(w);
            }
            break;
        case 13: { /* concat with itself or pad */
            if (xs.rank >= 1) {
                int32_t d = (int32_t)rg_pick(sc, (uint32_t)xs.rank);
                if (rg_pick(sc, 2)) {
                    tb_tensor *two[2];
                    two[0] = x;
                    two[1] = x;
                    y = tb_concat(two, 2, d);
                } else {
                    int64_t pads[2 * TB_MAX_RANK];
                    memset(pads, 0, sizeof pads);
                    pads[2 * (xs.rank - 1 - d)] = (int64_t)rg_pick(sc, 2);
                    pads[2 * (xs.rank - 1 - d) + 1] = 1;
                    y = tb_pad(x, pads, 2 * (size_t)xs.rank, 0.5);
                }
            }
            break;
        }
        case 14: { /* where on a sign test of the value itself */
            tb_tensor *zero = tb_zeros(&xs, dev), *cond = tb_gt(x, zero);
            tb_tensor *neg = tb_neg(x);
            y = tb_where(cond, x, neg);
            tb_tensor_release(zero);
            tb_tensor_release(cond);
            tb_tensor_release(neg);
            break;
        }
        default:
            y = tb_abs(x);
            break;
        }
        if (y == NULL) {
            if (tb_last_status() != TB_OK && op != 5 && op != 6 && op != 9) {
                /* every op above is valid by construction */
                fail_msg("random graph step %d op %u: %s", step, op, tb_last_error());
            }
            tb_clear_error();
            continue;
        }
        if (rg_numel(y) > (sc->wide ? 16384 : 4096)) { /* keep graphs small */
            tb_tensor_release(y);
            continue;
        }
        if (n < POOL) {
            pool[n++] = y;
        } else {
            int k = (int)rg_pick(sc, POOL);
            tb_tensor_release(pool[k]);
            pool[k] = y;
        }
    }
    /* the result combines the last value with a reduction of another */
    result = tb_tensor_retain(pool[n - 1]);
    for (i = 0; i < n; i++)
        tb_tensor_release(pool[i]);
    return result;
}

static void random_graphs(int graphs, bool wide) {
    const int per_batch = 12;
    rg_script *scripts = (rg_script *)calloc((size_t)per_batch, sizeof(rg_script));
    int g, b, j;
    REQUIRE_OPENCL();
    assert_non_null(scripts);
    g_rng = 0x5EED0000ull + 20240611ull + (wide ? 7u : 0u);
    for (g = 0; g < graphs; g += per_batch) {
        for (b = 0; b < per_batch; b++) {
            char name[64];
            test_case *c = &g_cases[g_num_cases];
            rg_script *sc = &scripts[b];
            memset(sc, 0, sizeof *sc);
            sc->wide = wide;
            snprintf(c->name, sizeof c->name, "random %sgraph %d", wide ? "wide " : "", g + b);
            c->ref = rg_build(sc, &g_cpu, 3 + (g + b) % 9);
            c->got = rg_build(sc, &g_ocl, 3 + (g + b) % 9);
            if (c->ref == NULL || c->got == NULL) fail_msg("%s: %s", c->name, tb_last_error());
            g_num_cases++;
            (void)name;
        }
        flush_cases();
        for (b = 0; b < per_batch; b++)
            for (j = 0; j < scripts[b].num_inputs; j++)
                free(scripts[b].inputs[j].data);
    }
    free(scripts);
}

static void test_random_graphs(void **state) {
    (void)state;
    random_graphs(216, false);
}

/* Rows of 32 to 96 elements: reductions, softmax and elementwise kernels take their vector
   code, and inputs broadcast along the row ([8, 1] against [8, 32]) must be read as one value
   per row, not as a vector. */
static void test_random_wide_graphs(void **state) {
    (void)state;
    random_graphs(120, true);
}

/* Every kernel kind that has vector code (row reductions, softmax, layer norm, elementwise
   blocks) with a second operand of each relation to the row: the whole row, one value per row,
   one value per column, one value: b must be read as a vector, a broadcast value or a scalar,
   and the result must match the cpu backend. */
static tb_tensor *vr_input(const tb_shape *s, const tb_device *dev, uint64_t seed) {
    void *h = host_alloc(s);
    tb_tensor *t;
    g_rng = seed;
    fill(h, s, R_ANY, 0);
    t = tb_tensor_from_host(h, s, dev);
    free(h);
    assert_non_null(t);
    return t;
}

static tb_tensor *vr_build(int kind, tb_tensor *x, tb_tensor *b) {
    int32_t axis = 1;
    tb_tensor *xb = tb_mul(x, b), *t = tb_add(xb, b), *y = NULL;
    assert_non_null(t);
    switch (kind) {
    case 0:
        y = tb_sum(t, &axis, 1, true);
        break;
    case 1:
        y = tb_mean(t, &axis, 1, false);
        break;
    case 2:
        y = tb_max(t, &axis, 1, true);
        break;
    case 3:
        y = tb_min(t, &axis, 1, false);
        break;
    case 4:
        y = tb_softmax(t, 1);
        break;
    case 5:
        y = tb_layer_norm(t, 1, NULL, NULL, 1e-5);
        break;
    case 6: { /* the reduction's result broadcast back along the row, reduced again */
        tb_tensor *m = tb_max(t, &axis, 1, true), *u = tb_sub(x, m);
        y = tb_sum(u, &axis, 1, true);
        tb_tensor_release(m);
        tb_tensor_release(u);
        break;
    }
    default:
        y = tb_exp(t);
        break;
    }
    tb_tensor_release(xb);
    tb_tensor_release(t);
    assert_non_null(y);
    return y;
}

static void test_vector_operand_relations(void **state) {
    static const char *kinds[8] = {"sum",     "mean",       "max",     "min",
                                   "softmax", "layer_norm", "max/sum", "exp"};
    static const char *rels[5] = {"[R,C]", "[R,1]", "[1,C]", "[C]", "[]"};
    const int64_t R = 40, C = 64;
    int kind, rel;
    (void)state;
    REQUIRE_OPENCL();
    for (kind = 0; kind < 8; kind++) {
        for (rel = 0; rel < 5; rel++) {
            tb_shape xs = tb_shape_of(TB_F32, 2, (int)R, (int)C), bs;
            tb_tensor *xr, *br, *xg, *bg, *ref, *got;
            char what[96];
            if (rel == 0) bs = xs;
            if (rel == 1) bs = tb_shape_of(TB_F32, 2, (int)R, 1);
            if (rel == 2) bs = tb_shape_of(TB_F32, 2, 1, (int)C);
            if (rel == 3) bs = tb_shape_of(TB_F32, 1, (int)C);
            if (rel == 4) bs = tb_shape_of(TB_F32, 0);
            xr = vr_input(&xs, &g_cpu, 11);
            br = vr_input(&bs, &g_cpu, 12);
            xg = vr_input(&xs, &g_ocl, 11);
            bg = vr_input(&bs, &g_ocl, 12);
            ref = vr_build(kind, xr, br);
            got = vr_build(kind, xg, bg);
            snprintf(what, sizeof what, "%s of x * b + b, b %s", kinds[kind], rels[rel]);
            compare_tensors(what, ref, got);
            tb_tensor_release(xr);
            tb_tensor_release(br);
            tb_tensor_release(xg);
            tb_tensor_release(bg);
            tb_tensor_release(ref);
            tb_tensor_release(got);
        }
    }
}

/* A matmul that becomes the core of the elementwise kernel reading it takes that kernel's
   position key; graphs of every size before it make the planner's key table grow at that
   moment in one of them (the key was once read from the table while it moved). */
static void test_matmul_core_key_table_growth(void **state) {
    tb_shape xs = tb_shape_of(TB_F32, 2, 6, 7), ws = tb_shape_of(TB_F32, 2, 7, 7);
    tb_shape bs = tb_shape_of(TB_F32, 1, 7);
    int extra, layers, d, i;
    (void)state;
    REQUIRE_OPENCL();
    for (layers = 1; layers <= 3; layers++) {
        /* every chain length for one layer; every fifth for more (each is a compile) */
        for (extra = 0; extra < 40; extra += layers == 1 ? 1 : 5) {
            tb_tensor *out[2];
            for (d = 0; d < 2; d++) {
                const tb_device *dev = d == 0 ? &g_cpu : &g_ocl;
                tb_tensor *x = vr_input(&xs, dev, 21), *w = vr_input(&ws, dev, 22);
                tb_tensor *b = vr_input(&bs, dev, 23), *h = tb_tensor_retain(x);
                for (i = 0; i < extra; i++) { /* a chain of elementwise producers */
                    tb_tensor *t = i % 2 ? tb_tanh(h) : tb_add(h, x);
                    tb_tensor_release(h);
                    h = t;
                }
                for (i = 0; i < layers; i++) { /* relu(h @ w + b), as a network's layers */
                    tb_tensor *m = tb_matmul(h, w), *z = tb_add(m, b);
                    tb_tensor_release(h);
                    h = tb_relu(z);
                    tb_tensor_release(m);
                    tb_tensor_release(z);
                }
                out[d] = h;
                assert_non_null(out[d]);
                tb_tensor_release(x);
                tb_tensor_release(w);
                tb_tensor_release(b);
            }
            compare_tensors("layers of relu(h @ w + b)", out[0], out[1]);
            tb_tensor_release(out[0]);
            tb_tensor_release(out[1]);
        }
    }
}

/* r <- max over each row of (r + x), chained: the [8, 1] running value is broadcast along
   the 32-wide row the vector reduction reads. */
static void test_vector_reduce_broadcast_operand(void **state) {
    float hx[8 * 32], h0[8], got[8], want[8];
    tb_shape xs = tb_shape_of(TB_F32, 2, 8, 32), rs = tb_shape_of(TB_F32, 2, 8, 1);
    const tb_device *devs[2];
    int d, i, r, step;
    (void)state;
    REQUIRE_OPENCL();
    devs[0] = &g_cpu;
    devs[1] = &g_ocl;
    for (i = 0; i < 8 * 32; i++)
        hx[i] = (float)((i * 37 % 101) / 50.0 - 1.0);
    for (r = 0; r < 8; r++)
        h0[r] = (float)r;
    for (d = 0; d < 2; d++) {
        tb_tensor *x = tb_tensor_from_host(hx, &xs, devs[d]);
        tb_tensor *v = tb_tensor_from_host(h0, &rs, devs[d]);
        int32_t axis = 1;
        assert_non_null(x);
        assert_non_null(v);
        for (step = 0; step < 6; step++) {
            tb_tensor *t = tb_add(v, x), *u = tb_max(t, &axis, 1, true);
            assert_non_null(u);
            tb_tensor_release(t);
            tb_tensor_release(v);
            v = u;
        }
        assert_int_equal(tb_tensor_to_host(v, d == 0 ? want : got, sizeof got), TB_OK);
        tb_tensor_release(v);
        tb_tensor_release(x);
    }
    for (r = 0; r < 8; r++) {
        float m = -INFINITY;
        for (i = 0; i < 32; i++)
            m = hx[r * 32 + i] > m ? hx[r * 32 + i] : m;
        /* (cmocka's float assert lets a NaN through) */
        if (!(fabsf(want[r] - ((float)r + 6.0f * m)) <= 1e-5f) ||
            !(fabsf(got[r] - want[r]) <= 1e-5f))
            fail_msg("row %d: %s gives %g, cpu %g, expected %g", r, TEST_BACKEND, (double)got[r],
                     (double)want[r], (double)((float)r + 6.0f * m));
    }
}

/* ---- devices, transfers, memory ---- */

static void test_devices(void **state) {
    tb_device devs[8];
    tb_device_info info;
    tb_device_type type;
    int32_t ordinal = -1;
    size_t count = 0, i;
    tb_device d;
    (void)state;
    REQUIRE_OPENCL();
    assert_int_equal(tb_backend_devices("opencl", devs, 8, &count), TB_OK);
    assert_true(count >= 1);
    for (i = 0; i < count && i < 8; i++) {
        assert_int_equal(tb_backend_device_info(&devs[i], &info), TB_OK);
        assert_string_equal(info.device.backend, "opencl");
        assert_int_equal(info.device.ordinal, (int32_t)i);
        assert_int_equal(info.device.type, devs[i].type);
        assert_true(info.name[0] != '\0');
        assert_true(info.driver_version[0] != '\0');
        assert_non_null(strstr(info.language_version, "OpenCL C"));
        assert_true(info.global_memory > 0);
        assert_true(info.max_allocation > 0 && info.max_allocation <= info.global_memory);
        assert_true(info.compute_units >= 1);
        assert_true(info.max_work_group_size >= 1);
        assert_int_equal(info.supports_f64, strstr(info.extensions, "cl_khr_fp64") != NULL);
    }
    /* the default is the first GPU, else accelerator, else CPU: type and ordinal agree */
    assert_int_equal(tb_backend_get_default_device_type("opencl", &type), TB_OK);
    assert_int_equal(tb_backend_get_default_device_ordinal("opencl", &ordinal), TB_OK);
    assert_true(ordinal >= 0 && (size_t)ordinal < count);
    assert_int_equal(devs[ordinal].type, type);
    for (i = 0; i < (size_t)ordinal; i++) {
        assert_true(devs[i].type != TB_DEVICE_GPU);
        if (type == TB_DEVICE_CPU) assert_true(devs[i].type != TB_DEVICE_ACCELERATOR);
    }
    assert_int_equal(tb_device_make("opencl", (int32_t)count, &d), TB_ERR_NOT_FOUND);
    assert_non_null(strstr(tb_last_error(), "out of range"));
    {
        tb_opencl_native native;
        memset(&native, 0, sizeof native);
        assert_int_equal(tb_opencl_native_device(&g_ocl, &native), TB_OK);
        assert_non_null(native.platform);
        assert_non_null(native.device);
        assert_non_null(native.context);
        assert_non_null(native.queue);
        assert_int_equal(tb_opencl_native_device(&g_cpu, &native), TB_ERR_INVALID_ARGUMENT);
        assert_non_null(strstr(tb_last_error(), "tb_opencl_native_device"));
        assert_int_equal(tb_opencl_native_device(NULL, NULL), TB_ERR_INVALID_ARGUMENT);
    }
    {
        char *report = tb_backend_metrics_report("opencl");
        assert_non_null(report);
        assert_non_null(strstr(report, "OpenCL::BytesInUse"));
        tb_free(report);
    }
}

static void test_transfers(void **state) {
    const tb_dtype dtypes[] = {TB_F32, TB_F64, TB_I32, TB_I64, TB_U8, TB_BOOL};
    const int64_t sizes[] = {0, 1, 3, 1000, 300000};
    size_t d, k, bytes = 0;
    (void)state;
    REQUIRE_OPENCL();
    for (d = 0; d < 6; d++) {
        for (k = 0; k < 5; k++) {
            tb_shape s = shp(dtypes[d], 1, sizes[k], 0, 0, 0);
            void *a = host_alloc(&s), *b = host_alloc(&s);
            tb_tensor *t;
            assert_int_equal(tb_shape_nbytes(&s, &bytes), TB_OK);
            fill(a, &s, R_ANY, 0);
            t = tb_tensor_from_host(a, &s, &g_ocl);
            assert_non_null(t);
            assert_int_equal(tb_tensor_to_host(t, b, bytes), TB_OK);
            assert_memory_equal(a, b, bytes + (bytes == 0));
            tb_tensor_release(t);
            free(a);
            free(b);
        }
    }
    /* scalars: kept on the host until a kernel needs them */
    {
        double v = 0;
        tb_tensor *s = tb_scalar_tensor(tb_scalar_f(TB_F32, 2.5), &g_ocl), *t;
        assert_non_null(s);
        assert_int_equal(tb_tensor_item(s, &v), TB_OK);
        assert_true(v == 2.5);
        t = tb_mul_scalar(s, 4.0);
        assert_int_equal(tb_tensor_item(t, &v), TB_OK);
        assert_true(v == 10.0);
        tb_tensor_release(s);
        tb_tensor_release(t);
    }
    /* the caching allocator gives freed memory back for reuse */
    {
        tb_shape s = shp(TB_F32, 1, 4096, 0, 0, 0);
        void *a = host_alloc(&s);
        tb_tensor *t;
        int64_t in_use, reused;
        void *mem = NULL;
        size_t size = 0;
        fill(a, &s, R_ANY, 0);
        t = tb_tensor_from_host(a, &s, &g_ocl);
        in_use = tb_metrics_counter("OpenCL::BytesInUse");
        assert_true(in_use >= 4096 * 4);
        assert_int_equal(tb_opencl_tensor_buffer(t, &mem, &size), TB_OK);
        assert_non_null(mem);
        assert_int_equal(size, 4096 * 4);
        tb_tensor_release(t);
        assert_int_equal(tb_metrics_counter("OpenCL::BytesInUse"), in_use - 4096 * 4);
        reused = tb_metrics_counter("OpenCL::BufferReuse");
        t = tb_tensor_from_host(a, &s, &g_ocl);
        assert_int_equal(tb_metrics_counter("OpenCL::BufferReuse"), reused + 1);
        tb_tensor_release(t);
        assert_int_equal(tb_opencl_trim_cache(NULL), TB_OK);
        assert_int_equal(tb_metrics_counter("OpenCL::BytesCached"), 0);
        free(a);
    }
}

static void test_allocation_too_large(void **state) {
    tb_device_info info;
    tb_shape s;
    tb_tensor *t, *u;
    tb_status st;
    char expect[64];
    int64_t n;
    (void)state;
    REQUIRE_OPENCL();
    assert_int_equal(tb_backend_device_info(&g_ocl, &info), TB_OK);
    n = (int64_t)(info.max_allocation / 4) + 1024; /* f32: just over the largest allocation */
    s = shp(TB_F32, 1, n, 0, 0, 0);
    t = tb_full(&s, 1.0, &g_ocl);
    assert_non_null(t);
    u = tb_add_scalar(t, 1.0);
    st = tb_sync(&u, 1);
    assert_int_equal(st, TB_ERR_OUT_OF_MEMORY);
    snprintf(expect, sizeof expect, "%lld bytes", (long long)n * 4);
    assert_non_null(strstr(tb_last_error(), expect));
    snprintf(expect, sizeof expect, "%llu bytes", (unsigned long long)info.max_allocation);
    assert_non_null(strstr(tb_last_error(), expect));
    tb_tensor_release(t);
    tb_tensor_release(u);
    /* the backend keeps working */
    {
        float a[3] = {1, 2, 3}, b[3];
        tb_shape s3 = shp(TB_F32, 1, 3, 0, 0, 0);
        tb_tensor *x = tb_tensor_from_host(a, &s3, &g_ocl), *y = tb_add_scalar(x, 1.0);
        assert_int_equal(tb_tensor_to_host(y, b, sizeof b), TB_OK);
        assert_true(b[0] == 2 && b[1] == 3 && b[2] == 4);
        tb_tensor_release(x);
        tb_tensor_release(y);
    }
}

static void test_run_time_errors(void **state) {
    float a[6] = {1, 2, 3, 4, 5, 6}, got[6];
    int64_t idx[3] = {0, 5, 1};
    int32_t base[3] = {2, 3, 4}, ex[3] = {1, -1, 2}, gi[3];
    tb_shape sa = shp(TB_F32, 2, 2, 3, 0, 0), si = shp(TB_I64, 1, 3, 0, 0, 0),
             s3 = shp(TB_I32, 1, 3, 0, 0, 0);
    tb_tensor *x, *i, *y, *b, *e, *p;
    (void)state;
    REQUIRE_OPENCL();
    x = tb_tensor_from_host(a, &sa, &g_ocl);
    i = tb_tensor_from_host(idx, &si, &g_ocl);
    y = tb_index_select(x, 1, i);
    assert_int_equal(tb_tensor_to_host(y, got, sizeof got), TB_ERR_EXECUTE);
    assert_non_null(strstr(tb_last_error(), "index 5 is out of range for dim 1 of size 3"));
    tb_tensor_release(y);
    b = tb_tensor_from_host(base, &s3, &g_ocl);
    e = tb_tensor_from_host(ex, &s3, &g_ocl);
    p = tb_pow(b, e);
    assert_int_equal(tb_tensor_to_host(p, gi, sizeof gi), TB_ERR_EXECUTE);
    assert_non_null(strstr(tb_last_error(), "negative integer powers"));
    tb_tensor_release(x);
    tb_tensor_release(i);
    tb_tensor_release(b);
    tb_tensor_release(e);
    tb_tensor_release(p);
}

/* Many work items fail at once: the report is one item's. Each item's pair is recognisable
   (base b with exponent -b; an index of the first select in [1000, 1000 + n) against dim 0 of
   size 3, of the second in [5000000000, 5000000000 + n) against size 5), so a report made of
   two items' words, or of one site's code and another's index, fails the test. */
static void test_run_time_error_reports_one_item(void **state) {
    enum { N = 20000 };
    static int32_t base[N], ex[N];
    static int64_t i1[N], i2[N];
    float xs[3] = {1, 2, 3}, xl[5] = {1, 2, 3, 4, 5};
    tb_shape sn = shp(TB_I32, 1, N, 0, 0, 0), si = shp(TB_I64, 1, N, 0, 0, 0),
             s3 = shp(TB_F32, 1, 3, 0, 0, 0), s5 = shp(TB_F32, 1, 5, 0, 0, 0);
    tb_tensor *b, *e, *p, *x3, *x5, *t1, *t2, *g1, *g2, *y;
    long long got_b = 0, got_e = 0, idx = 0;
    int round, size = 0;
    (void)state;
    REQUIRE_OPENCL();
    for (round = 0; round < N; round++) {
        base[round] = round + 2;
        ex[round] = -(round + 2);
        i1[round] = 1000 + round;
        i2[round] = 5000000000ll + round;
    }
    for (round = 0; round < 3; round++) {
        b = tb_tensor_from_host(base, &sn, &g_ocl);
        e = tb_tensor_from_host(ex, &sn, &g_ocl);
        p = tb_pow(b, e);
        assert_int_equal(tb_sync(&p, 1), TB_ERR_EXECUTE);
        if (sscanf(strstr(tb_last_error(), "(") != NULL ? strstr(tb_last_error(), "(") : "",
                   "(%lld ** %lld)", &got_b, &got_e) != 2)
            fail_msg("unexpected message: %s", tb_last_error());
        if (got_b < 2 || got_b > N + 1 || got_e != -got_b)
            fail_msg("a report of two items: %s", tb_last_error());
        tb_tensor_release(b);
        tb_tensor_release(e);
        tb_tensor_release(p);
        x3 = tb_tensor_from_host(xs, &s3, &g_ocl);
        x5 = tb_tensor_from_host(xl, &s5, &g_ocl);
        t1 = tb_tensor_from_host(i1, &si, &g_ocl);
        t2 = tb_tensor_from_host(i2, &si, &g_ocl);
        g1 = tb_index_select(x3, 0, t1);
        g2 = tb_index_select(x5, 0, t2);
        y = tb_add(g1, g2);
        assert_int_equal(tb_sync(&y, 1), TB_ERR_EXECUTE);
        if (sscanf(strstr(tb_last_error(), "index ") != NULL ? strstr(tb_last_error(), "index ")
                                                             : "",
                   "index %lld is out of range for dim 0 of size %d", &idx, &size) != 2)
            fail_msg("unexpected message: %s", tb_last_error());
        if (!((size == 3 && idx >= 1000 && idx < 1000 + N) ||
              (size == 5 && idx >= 5000000000ll && idx < 5000000000ll + N)))
            fail_msg("a report of two sites or items: %s", tb_last_error());
        tb_tensor_release(x3);
        tb_tensor_release(x5);
        tb_tensor_release(t1);
        tb_tensor_release(t2);
        tb_tensor_release(g1);
        tb_tensor_release(g2);
        tb_tensor_release(y);
    }
}

/* ---- two devices ---- */

/* Two threads on two devices run at once: a run on opencl:0 stops, while it holds its device,
   in the logger's callback of its first kernel line (TB_DEBUG=2), until a whole sync on
   opencl:1 has finished on another thread. With one lock for the backend that sync would wait
   for the first run: the first thread's wait ends after 60 s and the test fails (a guard
   against a hang, not a timing threshold). */
static pthread_mutex_t g_par_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_par_cond = PTHREAD_COND_INITIALIZER;
static int g_par_inside, g_par_other_done, g_par_timed_out;
static pthread_t g_par_waiter;

static void par_logger(tb_log_level level, const char *message, void *user_data) {
    struct timespec until;
    (void)level, (void)user_data;
    if (strncmp(message, "opencl:0 ", 9) != 0 || !pthread_equal(pthread_self(), g_par_waiter))
        return;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 60;
    pthread_mutex_lock(&g_par_lock);
    if (!g_par_inside) {
        g_par_inside = 1;
        pthread_cond_broadcast(&g_par_cond);
        while (!g_par_other_done && !g_par_timed_out) {
            if (pthread_cond_timedwait(&g_par_cond, &g_par_lock, &until) != 0) g_par_timed_out = 1;
        }
    }
    pthread_mutex_unlock(&g_par_lock);
}

static void *par_run_device0(void *arg) {
    tb_tensor *y = (tb_tensor *)arg;
    return (void *)(intptr_t)tb_sync(&y, 1);
}

static void test_two_devices_run_at_once(void **state) {
    float a[256], got[256];
    tb_shape s = shp(TB_F32, 1, 256, 0, 0, 0);
    tb_device d0, d1;
    tb_desc desc;
    tb_tensor *x0, *y0, *x1, *y1;
    size_t count = 0;
    void *rc = NULL;
    int i;
    (void)state;
    REQUIRE_OPENCL();
    assert_int_equal(tb_backend_devices("opencl", NULL, 0, &count), TB_OK);
    if (count < 2) {
        print_message("one OpenCL device only (POCL_DEVICES=\"pthread pthread\" gives two)\n");
        skip();
    }
    tb_shutdown();
    memset(&desc, 0, sizeof desc);
    desc.debug = 2;
    desc.logger.func = par_logger;
    assert_int_equal(tb_setup(&desc), TB_OK);
    assert_int_equal(tb_device_make("opencl", 0, &d0), TB_OK);
    assert_int_equal(tb_device_make("opencl", 1, &d1), TB_OK);
    for (i = 0; i < 256; i++)
        a[i] = (float)i;
    x0 = tb_tensor_from_host(a, &s, &d0);
    y0 = tb_mul_scalar(x0, 2.0);
    x1 = tb_tensor_from_host(a, &s, &d1);
    y1 = tb_add_scalar(x1, 1.0);
    g_par_inside = g_par_other_done = g_par_timed_out = 0;
    assert_int_equal(pthread_create(&g_par_waiter, NULL, par_run_device0, y0), 0);
    pthread_mutex_lock(&g_par_lock);
    while (!g_par_inside)
        pthread_cond_wait(&g_par_cond, &g_par_lock);
    pthread_mutex_unlock(&g_par_lock);
    /* opencl:0 is in the middle of a run: opencl:1 compiles and runs a graph meanwhile */
    assert_int_equal(tb_tensor_to_host(y1, got, sizeof got), TB_OK);
    for (i = 0; i < 256; i++)
        assert_true(got[i] == (float)i + 1.0f);
    pthread_mutex_lock(&g_par_lock);
    g_par_other_done = 1;
    pthread_cond_broadcast(&g_par_cond);
    pthread_mutex_unlock(&g_par_lock);
    pthread_join(g_par_waiter, &rc);
    assert_false(g_par_timed_out);
    assert_int_equal((int)(intptr_t)rc, TB_OK);
    assert_int_equal(tb_tensor_to_host(y0, got, sizeof got), TB_OK);
    for (i = 0; i < 256; i++)
        assert_true(got[i] == (float)i * 2.0f);
    tb_tensor_release(y0);
    tb_tensor_release(x0);
    tb_tensor_release(y1);
    tb_tensor_release(x1);
    tb_shutdown();
    assert_int_equal(tb_setup(NULL), TB_OK);
    probe();
}

static void test_two_devices(void **state) {
    tb_device d1;
    size_t count = 0;
    float a[64], r0[64], r1[64];
    tb_shape s = shp(TB_F32, 2, 8, 8, 0, 0);
    tb_tensor *x0, *y0, *x1, *y1, *back, *m0, *m1;
    int i;
    (void)state;
    REQUIRE_OPENCL();
    assert_int_equal(tb_backend_devices("opencl", NULL, 0, &count), TB_OK);
    if (count < 2) {
        print_message("one OpenCL device only (POCL_DEVICES=\"pthread pthread\" gives two)\n");
        skip();
    }
    assert_int_equal(tb_device_make("opencl", 1, &d1), TB_OK);
    fill(a, &s, R_ANY, 0);
    x0 = tb_tensor_from_host(a, &s, &g_ocl);
    y0 = tb_matmul(x0, x0);
    y0 = take(y0, tb_tanh(y0));
    x1 = tb_to_device(y0, &d1); /* computed on opencl:0, moved to opencl:1 */
    assert_non_null(x1);
    assert_int_equal(tb_tensor_device(x1).ordinal, 1);
    y1 = tb_mul_scalar(x1, 2.0);
    m1 = tb_sum(y1, NULL, 0, false);
    back = tb_to_device(y1, &g_ocl);
    m0 = tb_sum(back, NULL, 0, false);
    assert_int_equal(tb_tensor_to_host(back, r0, sizeof r0), TB_OK);
    assert_int_equal(tb_tensor_to_host(y1, r1, sizeof r1), TB_OK);
    for (i = 0; i < 64; i++)
        assert_true(r0[i] == r1[i]);
    {
        double v0 = 0, v1 = 0;
        assert_int_equal(tb_tensor_item(m0, &v0), TB_OK);
        assert_int_equal(tb_tensor_item(m1, &v1), TB_OK);
        assert_true(v0 == v1);
    }
    /* to the cpu and back: from the device's (mapped) memory, into a new data's */
    {
        tb_tensor *c = tb_to_device(y1, &g_cpu), *b0 = c != NULL ? tb_to_device(c, &g_ocl) : NULL;
        float rc[64], rb[64];
        assert_non_null(b0);
        assert_int_equal(tb_tensor_to_host(c, rc, sizeof rc), TB_OK);
        assert_int_equal(tb_tensor_to_host(b0, rb, sizeof rb), TB_OK);
        for (i = 0; i < 64; i++)
            assert_true(rc[i] == r1[i] && rb[i] == r1[i]);
        tb_tensor_release(b0);
        tb_tensor_release(c);
    }
    /* mixing devices in one op is an error that names both */
    {
        tb_tensor *bad = tb_add(x0, x1);
        assert_null(bad);
        assert_non_null(strstr(tb_last_error(), "opencl:1"));
    }
    tb_tensor_release(x0);
    tb_tensor_release(y0);
    tb_tensor_release(x1);
    tb_tensor_release(y1);
    tb_tensor_release(back);
    tb_tensor_release(m0);
    tb_tensor_release(m1);
}

/* ---- the program cache on disk ---- */

static char g_cache_dir[256];

static int count_cache_files(const char *dir, char *first, size_t cap) {
    DIR *d = opendir(dir);
    struct dirent *e;
    int n = 0;
    if (d == NULL) return 0;
    while ((e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        if (len > 6 && strcmp(e->d_name + len - 6, ".clbin") == 0) {
            if (n == 0 && first != NULL) snprintf(first, cap, "%s/%s", dir, e->d_name);
            n++;
        }
    }
    closedir(d);
    return n;
}

/* Runs one fixed graph in a fresh library state; returns its value's first element. */
static float run_fixed_graph(void) {
    float a[16], got[16];
    tb_shape s = shp(TB_F32, 2, 4, 4, 0, 0);
    tb_tensor *x, *y;
    int i;
    tb_device dev;
    for (i = 0; i < 16; i++)
        a[i] = (float)i * 0.25f - 1.0f;
    assert_int_equal(tb_device_make("opencl", 0, &dev), TB_OK);
    x = tb_tensor_from_host(a, &s, &dev);
    y = tb_matmul(x, x);
    y = take(y, tb_add_scalar(y, 0.125));
    y = take(y, tb_softmax(y, 1));
    if (tb_tensor_to_host(y, got, sizeof got) != TB_OK) fail_msg("%s", tb_last_error());
    tb_tensor_release(x);
    tb_tensor_release(y);
    return got[5];
}

static void restart_library(void) {
    tb__ocl_program_key_mask = ~(uint64_t)0; /* a failed test may have left it cleared */
    tb_shutdown();
    assert_int_equal(tb_setup(NULL), TB_OK);
}

/* The tests of the library's own program cache: PoCL's kernel cache left to the library's
   choice as if it were off (POCL_KERNEL_CACHE=0, which PoCL itself read at its start), so that
   program binaries are written (tb__ocl_driver_caches). */
#define REQUIRE_OUR_DISK_CACHE()                                                                   \
    do {                                                                                           \
        REQUIRE_OPENCL();                                                                          \
        setenv("POCL_KERNEL_CACHE", "0", 1);                                                       \
    } while (0)

/* Whether opencl:0 is PoCL's (the library's own test of it). */
static bool first_device_is_pocl(void) {
    tb__ocl_runtime *rt;
    bool pocl = false;
    tb__mutex_lock(&tb__ocl_mutex);
    rt = tb__ocl_runtime_get();
    if (rt != NULL && rt->status == TB_OK && rt->num_devices > 0)
        pocl = strstr(rt->devices[0].platform_name, "Portable Computing Language") != NULL;
    tb__mutex_unlock(&tb__ocl_mutex);
    return pocl;
}

static void test_disk_cache(void **state) {
    char *old = getenv("TB_CACHE_DIR") != NULL ? strdup(getenv("TB_CACHE_DIR")) : NULL;
    char file[512];
    float first, again;
    (void)state;
    REQUIRE_OUR_DISK_CACHE();
    snprintf(g_cache_dir, sizeof g_cache_dir, "/tmp/tb_opencl_cache_XXXXXX");
    assert_non_null(mkdtemp(g_cache_dir));
    setenv("TB_CACHE_DIR", g_cache_dir, 1);

    restart_library();
    first = run_fixed_graph();
    assert_int_equal(tb_metrics_counter("OpenCL::ProgramBuild"), 1);
    assert_int_equal(tb_metrics_counter("OpenCL::DiskCacheMiss"), 1);
    assert_int_equal(tb_metrics_counter("OpenCL::DiskCacheHit"), 0);
    assert_int_equal(count_cache_files(g_cache_dir, file, sizeof file), 1);

    /* a fresh in-memory state: the binary comes from the disk */
    restart_library();
    again = run_fixed_graph();
    assert_true(first == again);
    assert_int_equal(tb_metrics_counter("OpenCL::DiskCacheHit"), 1);
    assert_int_equal(tb_metrics_counter("OpenCL::ProgramBuild"), 0);

    /* a corrupt file is ignored, rebuilt and rewritten */
    {
        FILE *f = fopen(file, "r+b");
        assert_non_null(f);
        assert_int_equal(fseek(f, 70, SEEK_SET), 0);
        fputc(0x5a, f);
        fputc(0xa5, f);
        fclose(f);
    }
    restart_library();
    again = run_fixed_graph();
    assert_true(first == again);
    assert_int_equal(tb_metrics_counter("OpenCL::DiskCacheHit"), 0);
    assert_int_equal(tb_metrics_counter("OpenCL::DiskCacheRejected"), 1);
    assert_int_equal(tb_metrics_counter("OpenCL::ProgramBuild"), 1);
    restart_library();
    again = run_fixed_graph();
    assert_true(first == again);
    assert_int_equal(tb_metrics_counter("OpenCL::DiskCacheHit"), 1);

    /* a truncated file, then a file of garbage, are ignored too */
    assert_int_equal(truncate(file, 30), 0);
    restart_library();
    again = run_fixed_graph();
    assert_true(first == again);
    assert_int_equal(tb_metrics_counter("OpenCL::DiskCacheRejected"), 1);
    assert_int_equal(tb_metrics_counter("OpenCL::ProgramBuild"), 1);
    {
        FILE *f = fopen(file, "wb");
        assert_non_null(f);
        fputs("TBOCLBIN this is not a program binary, only text that looks like a header....", f);
        fclose(f);
    }
    restart_library();
    again = run_fixed_graph();
    assert_true(first == again);
    assert_int_equal(tb_metrics_counter("OpenCL::DiskCacheRejected"), 1);
    assert_int_equal(tb_metrics_counter("OpenCL::ProgramBuild"), 1);
    assert_int_equal(count_cache_files(g_cache_dir, NULL, 0), 1);

#if defined(TB__OCL_DISK_CACHE) && TB__OCL_DISK_CACHE
    /* the right key and checksum around a binary the driver does not load */
    {
        static unsigned char bytes[1 << 22];
        size_t n, kn, bn;
        FILE *f = fopen(file, "rb");
        assert_non_null(f);
        n = fread(bytes, 1, sizeof bytes, f);
        fclose(f);
        assert_true(n > TB__OCL_BIN_HEADER && n < sizeof bytes);
        kn = (size_t)tb__ocl_get64(bytes + 32);
        assert_true(TB__OCL_BIN_HEADER + kn < n);
        bn = n - TB__OCL_BIN_HEADER - kn;
        memset(bytes + TB__OCL_BIN_HEADER + kn, 0x5a, bn);
        tb__ocl_put64(bytes + 48, tb__ocl_disk_checksum(bytes + TB__OCL_BIN_HEADER, kn,
                                                        bytes + TB__OCL_BIN_HEADER + kn, bn));
        f = fopen(file, "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(bytes, 1, n, f), n);
        fclose(f);
    }
    restart_library();
    again = run_fixed_graph();
    assert_true(first == again);
    assert_int_equal(tb_metrics_counter("OpenCL::DiskCacheRejected"), 1);
    assert_int_equal(tb_metrics_counter("OpenCL::ProgramBuild"), 1);
    restart_library();
    again = run_fixed_graph();
    assert_true(first == again);
    assert_int_equal(tb_metrics_counter("OpenCL::DiskCacheHit"), 1);
#endif

    /* "off" disables it */
    setenv("TB_CACHE_DIR", "off", 1);
    restart_library();
    (void)run_fixed_graph();
    assert_int_equal(tb_metrics_counter("OpenCL::DiskCacheMiss"), 0);
    assert_int_equal(tb_metrics_counter("OpenCL::DiskCacheHit"), 0);
    assert_int_equal(tb_metrics_counter("OpenCL::ProgramBuild"), 1);

    remove(file);
    rmdir(g_cache_dir);
    if (old != NULL) {
        setenv("TB_CACHE_DIR", old, 1);
        free(old);
    } else {
        unsetenv("TB_CACHE_DIR");
    }
    restart_library();
    probe();
}

/* ---- the disk cache trusts no file it did not check ---- */

/* Saves TB_CACHE_DIR, points it at `dir` (created when `make` is set) and restarts. */
static char *cache_dir_begin(char *dir, size_t cap, bool make) {
    char *old = getenv("TB_CACHE_DIR") != NULL ? strdup(getenv("TB_CACHE_DIR")) : NULL;
    if (make) {
        snprintf(dir, cap, "/tmp/tb_opencl_cache_XXXXXX");
        assert_non_null(mkdtemp(dir));
    }
    setenv("TB_CACHE_DIR", dir, 1);
    restart_library();
    return old;
}

static void cache_dir_end(char *old) {
    if (old != NULL) {
        setenv("TB_CACHE_DIR", old, 1);
        free(old);
    } else {
        unsetenv("TB_CACHE_DIR");
    }
    restart_library();
    probe();
}

/* With PoCL's kernel cache on, the library writes no binary of PoCL's programs to its own
   cache (PoCL would compile every kernel again to serialise one); the results are the same. */
static void test_disk_cache_left_to_pocl(void **state) {
    char dir[64], *old;
    float first, again;
    (void)state;
    REQUIRE_OPENCL();
    unsetenv("POCL_KERNEL_CACHE");
    if (!first_device_is_pocl()) skip();
    old = cache_dir_begin(dir, sizeof dir, true);
    first = run_fixed_graph();
    assert_int_equal(count_cache_files(dir, NULL, 0), 0);
    restart_library();
    again = run_fixed_graph();
    assert_true(first == again);
    assert_int_equal(count_cache_files(dir, NULL, 0), 0);
    rmdir(dir);
    cache_dir_end(old);
}

/* Removes the files of a folder (not its subfolders), then the folder. */
static void remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *e;
    char path[600];
    if (d != NULL) {
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            unlink(path);
        }
        closedir(d);
    }
    rmdir(dir);
}

/* x + y (op 0) or x - y (op 1) of two fixed f32[4,4] inputs on opencl:0: both programs have
   one kernel of the same name and arguments. `got` gets the value; the expected one is
   checked here. */
static void run_pair(int op, float *got) {
    float a[16], b[16];
    tb_shape s = shp(TB_F32, 2, 4, 4, 0, 0);
    tb_tensor *x, *y, *z;
    tb_device dev;
    int i;
    for (i = 0; i < 16; i++) {
        a[i] = (float)i;
        b[i] = (float)(100 - 3 * i);
    }
    assert_int_equal(tb_device_make("opencl", 0, &dev), TB_OK);
    x = tb_tensor_from_host(a, &s, &dev);
    y = tb_tensor_from_host(b, &s, &dev);
    z = op == 0 ? tb_add(x, y) : tb_sub(x, y);
    if (tb_tensor_to_host(z, got, 16 * sizeof(float)) != TB_OK) fail_msg("%s", tb_last_error());
    for (i = 0; i < 16; i++) {
        float want = op == 0 ? a[i] + b[i] : a[i] - b[i];
        if (got[i] != want) fail_msg("element %d: %g, want %g", i, got[i], want);
    }
    tb_tensor_release(x);
    tb_tensor_release(y);
    tb_tensor_release(z);
}

/* The path of the only entry in `dir` (a fresh program was just run there). */
static void only_entry(const char *dir, char *path, size_t cap) {
    assert_int_equal(count_cache_files(dir, path, cap), 1);
}

static bool is_regular_file(const char *path) {
    struct stat st;
    return lstat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static size_t read_file(const char *path, unsigned char *buf, size_t cap) {
    FILE *f = fopen(path, "rb");
    size_t n;
    assert_non_null(f);
    n = fread(buf, 1, cap, f);
    fclose(f);
    return n;
}

static void write_file(const char *path, const void *buf, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

/* An entry named like another program's and carrying that name's key hash in its header,
   with a binary of a different source: the full key it holds does not match, so it is not
   run; it is removed, counted, rebuilt and rewritten. */
static void test_disk_cache_forged_entry(void **state) {
    static unsigned char bytes[1 << 22];
    char dir[256], sub_path[512], add_path[512], hex[17];
    const char *name;
    float got[16];
    size_t n;
    int half, i;
    char *old;
    (void)state;
    REQUIRE_OUR_DISK_CACHE();
    old = cache_dir_begin(dir, sizeof dir, true);
    run_pair(1, got);
    only_entry(dir, sub_path, sizeof sub_path);
    n = read_file(sub_path, bytes, sizeof bytes);
    assert_true(n > 64 && n < sizeof bytes);
    assert_int_equal(remove(sub_path), 0);
    restart_library();
    run_pair(0, got);
    only_entry(dir, add_path, sizeof add_path);
    /* the x - y binary, under the x + y name, with the name's hash in the header */
    name = strrchr(add_path, '/') + 1;
    for (half = 0; half < 2; half++) {
        uint64_t v;
        memcpy(hex, name + 16 * half, 16);
        hex[16] = '\0';
        v = strtoull(hex, NULL, 16);
        for (i = 0; i < 8; i++)
            bytes[16 + 8 * half + i] = (unsigned char)(v >> (8 * i));
    }
    write_file(add_path, bytes, n);
    restart_library();
    run_pair(0, got); /* checks the values */
    assert_int_equal(tb_metrics_counter("OpenCL::DiskCacheRejected"), 1);
    assert_int_equal(tb_metrics_counter("OpenCL::DiskCacheHit"), 0);
    assert_int_equal(tb_metrics_counter("OpenCL::ProgramBuild"), 1);
    /* the rebuilt entry replaced it */
    restart_library();
    run_pair(0, got);
    assert_int_equal(tb_metrics_counter("OpenCL::DiskCacheHit"), 1);
    assert_int_equal(tb_metrics_counter("OpenCL::DiskCacheRejected"), 0);
    assert_int_equal(count_cache_files(dir, NULL, 0), 1);
    remove_dir(dir);
    cache_dir_end(old);
}

static void fifo_hang(int sig) {
    static const char message[] = "\ntest_opencl: hung opening a FIFO in the cache folder\n";
    (void)sig;
    if (write(2, message, sizeof message - 1) < 0) _exit(4);
    _exit(3);
}

/* A FIFO where an entry belongs: opening it would wait for a writer forever. It is rejected
   without blocking and the rebuilt entry, a regular file, takes its place. The alarm turns a
   hang into a failure. */
static void test_disk_cache_fifo_entry(void **state) {
    char dir[256], path[512];
    float got[16];
    char *old;
    (void)state;
    REQUIRE_OUR_DISK_CACHE();
    old = cache_dir_begin(dir, sizeof dir, true);
    run_pair(0, got);
    only_entry(dir, path, sizeof path);
    assert_int_equal(remove(path), 0);
    assert_int_equal(mkfifo(path, 0600), 0);
    restart_library();
    signal(SIGALRM, fifo_hang);
    alarm(120);
    run_pair(0, got);
    alarm(0);
    signal(SIGALRM, SIG_DFL);
    assert_int_equal(tb_metrics_counter("OpenCL::DiskCacheRejected"), 1);
    assert_int_equal(tb_metrics_counter("OpenCL::ProgramBuild"), 1);
    assert_true(is_regular_file(path));
    remove_dir(dir);
    cache_dir_end(old);
}

/* Symbolic links at an entry's path and at the temporary paths its writer tries: none is
   followed (the file they point at keeps its bytes); entries are written as regular files. */
static void test_disk_cache_symlinks(void **state) {
    static const char precious[] = "not a cache entry: leave me alone\n";
    char dir[256], other[256], victim[512], path[512], links[8][600];
    unsigned char bytes[256];
    const char *name;
    float got[16];
    unsigned first;
    char *old;
    int i;
    (void)state;
    REQUIRE_OUR_DISK_CACHE();
    snprintf(other, sizeof other, "/tmp/tb_opencl_victim_XXXXXX");
    assert_non_null(mkdtemp(other));
    snprintf(victim, sizeof victim, "%s/precious.txt", other);
    write_file(victim, precious, sizeof precious - 1);
    old = cache_dir_begin(dir, sizeof dir, true);
    run_pair(0, got);
    only_entry(dir, path, sizeof path);
    name = strrchr(path, '/') + 1;

    /* the entry's path: read through O_NOFOLLOW, replaced by a rename */
    assert_int_equal(remove(path), 0);
    assert_int_equal(symlink(victim, path), 0);
    restart_library();
    run_pair(0, got);
    assert_int_equal(tb_metrics_counter("OpenCL::DiskCacheRejected"), 1);
    assert_true(is_regular_file(path));
    assert_int_equal(read_file(victim, bytes, sizeof bytes), sizeof precious - 1);
    assert_memory_equal(bytes, precious, sizeof precious - 1);

    /* the temporary paths the writer tries next: created with O_EXCL, so never followed */
    assert_int_equal(remove(path), 0);
    restart_library();
    first = tb__disk_counter;
    for (i = 0; i < 8; i++) {
        snprintf(links[i], sizeof links[i], "%s/.%.32s.%ld.%u.tmp", dir, name, (long)getpid(),
                 first + (unsigned)i);
        assert_int_equal(symlink(victim, links[i]), 0);
    }
    run_pair(0, got);
    assert_int_equal(read_file(victim, bytes, sizeof bytes), sizeof precious - 1);
    assert_memory_equal(bytes, precious, sizeof precious - 1);
    assert_true(is_regular_file(path));
    restart_library();
    run_pair(0, got);
    assert_int_equal(tb_metrics_counter("OpenCL::DiskCacheHit"), 1);
    for (i = 0; i < 8; i++)
        unlink(links[i]);
    remove_dir(dir);
    remove_dir(other);
    cache_dir_end(old);
}

static char g_dir_log[4096];

static void capture_dir_log(tb_log_level level, const char *message, void *user_data) {
    size_t n = strlen(g_dir_log);
    (void)level;
    (void)user_data;
    snprintf(g_dir_log + n, sizeof g_dir_log - n, "%s\n", message);
}

/* The folders the cache creates are private (0700); an existing folder that others may write
   to is not used, and TB_DEBUG says so once. */
static void test_disk_cache_private_folder(void **state) {
    char base[256], mid[300], dir[320];
    const char *at;
    float got[16];
    struct stat st;
    tb_desc desc;
    int times = 0;
    char *old;
    (void)state;
    REQUIRE_OUR_DISK_CACHE();
    snprintf(base, sizeof base, "/tmp/tb_opencl_cache_XXXXXX");
    assert_non_null(mkdtemp(base));
    snprintf(mid, sizeof mid, "%s/new", base);
    snprintf(dir, sizeof dir, "%s/cache", mid);
    old = cache_dir_begin(dir, sizeof dir, false);
    run_pair(0, got);
    assert_int_equal(stat(dir, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0700);
    assert_int_equal(stat(mid, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0700);
    assert_int_equal(count_cache_files(dir, NULL, 0), 1);

    /* writable by the group and the world: ignored */
    assert_int_equal(chmod(dir, 0777), 0);
    tb_shutdown();
    memset(&desc, 0, sizeof desc);
    desc.debug = 1;
    desc.logger.func = capture_dir_log;
    g_dir_log[0] = '\0';
    assert_int_equal(tb_setup(&desc), TB_OK);
    run_pair(0, got);
    run_pair(1, got);
    assert_int_equal(tb_metrics_counter("OpenCL::DiskCacheHit"), 0);
    assert_int_equal(tb_metrics_counter("OpenCL::DiskCacheMiss"), 0);
    assert_int_equal(tb_metrics_counter("OpenCL::ProgramBuild"), 2);
    assert_int_equal(count_cache_files(dir, NULL, 0), 1);
    for (at = g_dir_log; (at = strstr(at, dir)) != NULL; at++)
        times++;
    if (times != 1) fail_msg("the folder is named %d times in the log:\n%s", times, g_dir_log);
    assert_non_null(strstr(g_dir_log, "writable by others"));
    remove_dir(dir);
    rmdir(mid);
    rmdir(base);
    cache_dir_end(old);
}

/* Two programs whose keys collide (the hook keeps no bit of the key): the in-memory program
   cache compares the source too, so the second is built, not found. */
static void test_program_cache_key_collision(void **state) {
    char off[] = "off";
    float got[16];
    char *old;
    (void)state;
    REQUIRE_OPENCL();
    old = cache_dir_begin(off, sizeof off, false);
    tb__ocl_program_key_mask = 0;
    run_pair(0, got);
    run_pair(1, got); /* checks the values */
    tb__ocl_program_key_mask = ~(uint64_t)0;
    assert_int_equal(tb_metrics_counter("OpenCL::ProgramBuild"), 2);
    assert_int_equal(tb_metrics_counter("OpenCL::ProgramKeyCollision"), 1);
    cache_dir_end(old);
}

/* ---- reductions over a few elements, and repeated kernels ---- */

/* The graph of y on both devices: y(cpu) against y(device), and the device's kernel count. */
typedef tb_tensor *(*small_graph)(tb_tensor *const *in);

static tb_tensor *g_pool_relu(tb_tensor *const *in) {
    const int64_t k[2] = {3, 3}, st[2] = {2, 2}, pd[2] = {1, 1};
    tb_tensor *p = tb_max_pool2d(in[0], k, st, pd, NULL, false), *y = tb_relu(p);
    tb_tensor_release(p);
    return y;
}

static tb_tensor *g_depthwise_relu6(tb_tensor *const *in) {
    const int64_t pd[2] = {1, 1};
    tb_tensor *c = tb_conv2d(in[0], in[1], in[2], NULL, pd, NULL, 8), *y = tb_clamp(c, 0, 6);
    tb_tensor_release(c);
    return y;
}

static tb_tensor *g_sum_broadcast(tb_tensor *const *in) {
    int32_t ax = 3;
    tb_tensor *s = tb_sum(in[0], &ax, 1, true), *e = tb_exp(s), *y = tb_mul(e, in[0]);
    tb_tensor_release(e);
    tb_tensor_release(s);
    return y;
}

static void small_case(const char *what, small_graph f, int want_kernels, bool want_reduce_kernel) {
    tb_shape xs = shp(TB_F32, 4, 2, 8, 13, 12), ws = shp(TB_F32, 4, 8, 1, 3, 3),
             bs = shp(TB_F32, 1, 8, 0, 0, 0);
    const tb_shape *shapes[3] = {&xs, &ws, &bs};
    tb_tensor *in[2][3], *y[2];
    char *text;
    int d, j;
    for (j = 0; j < 3; j++) {
        size_t n = numel_of(shapes[j]), i;
        float *v = (float *)malloc(n * sizeof(float));
        assert_non_null(v);
        for (i = 0; i < n; i++) /* small integers: ties in every window */
            v[i] = (float)((int)(rnd_unit() * 7.0) - 3);
        for (d = 0; d < 2; d++)
            in[d][j] = tb_tensor_from_host(v, shapes[j], d ? &g_ocl : &g_cpu);
        free(v);
    }
    for (d = 0; d < 2; d++) {
        y[d] = f(in[d]);
        assert_non_null(y[d]);
    }
    assert_int_equal(kernel_count(&y[1], 1), want_kernels);
    text = tb_ir_backend_text(&y[1], 1);
    assert_non_null(text);
    if ((strstr(text, "void R_") != NULL) != want_reduce_kernel)
        fail_msg("%s: a reduction kernel %s", what, want_reduce_kernel ? "missing" : "made");
    tb_free(text);
    compare_tensors(what, y[0], y[1]);
    for (d = 0; d < 2; d++) {
        tb_tensor_release(y[d]);
        for (j = 0; j < 3; j++)
            tb_tensor_release(in[d][j]);
    }
}

static void test_small_reductions_inline(void **state) {
    (void)state;
    REQUIRE_OPENCL();
    /* a 3 x 3 max-pool and the ReLU after it: one kernel, the window's max unrolled in it */
    small_case("max-pool and relu", g_pool_relu, 1, false);
    /* a depthwise convolution with bias and clamp, its padding read in place: one kernel */
    small_case("depthwise convolution", g_depthwise_relu6, 1, false);
    /* a sum of 12 broadcast back over its row: computed once per row in a kernel of its own
       (inlined, each value would be summed again at every element of its row) */
    small_case("sum broadcast", g_sum_broadcast, 2, false);
}

/* Two kernels doing the same work on other buffers: one function in the program. */
static void test_repeated_kernels_once(void **state) {
    tb_shape s = shp(TB_F32, 2, 64, 48, 0, 0);
    tb_tensor *a[2], *b[2], *y[2][2];
    int d;
    (void)state;
    REQUIRE_OPENCL();
    for (d = 0; d < 2; d++) {
        const tb_device *dev = d ? &g_ocl : &g_cpu;
        tb_tensor *ea, *eb;
        tb_manual_seed(3);
        a[d] = tb_rand(&s, dev);
        b[d] = tb_rand(&s, dev);
        assert_int_equal(tb_sync(a + d, 1), TB_OK);
        assert_int_equal(tb_sync(b + d, 1), TB_OK);
        ea = tb_exp(a[d]);
        eb = tb_exp(b[d]);
        y[d][0] = tb_mul_scalar(ea, 2.0);
        y[d][1] = tb_mul_scalar(eb, 2.0);
        tb_tensor_release(ea);
        tb_tensor_release(eb);
    }
    assert_int_equal(kernel_count(y[1], 2), 1);
    compare_tensors("first of two repeated kernels", y[0][0], y[1][0]);
    compare_tensors("second of two repeated kernels", y[0][1], y[1][1]);
    for (d = 0; d < 2; d++) {
        tb_tensor_release(y[d][0]);
        tb_tensor_release(y[d][1]);
        tb_tensor_release(a[d]);
        tb_tensor_release(b[d]);
    }
}

/* Kernels that differ only in the scalars they read (more scalars than arguments take: a
   table of them) share one function, each reading its own values. */
static void test_repeated_kernels_other_scalars(void **state) {
    enum { N = 20 };
    tb_shape s = shp(TB_F32, 2, 8, 33, 0, 0);
    tb_tensor *x[2][N], *y[2][N];
    int d, i;
    (void)state;
    REQUIRE_OPENCL();
    for (d = 0; d < 2; d++) {
        const tb_device *dev = d ? &g_ocl : &g_cpu;
        tb_manual_seed(5);
        for (i = 0; i < N; i++) {
            tb_tensor *t;
            x[d][i] = tb_rand(&s, dev);
            assert_int_equal(tb_sync(&x[d][i], 1), TB_OK);
            t = tb_mul_scalar(x[d][i], 0.25 + i); /* one scalar each: 20 in the graph */
            y[d][i] = tb_add_scalar(t, -1.5 * i);
            tb_tensor_release(t);
        }
    }
    assert_int_equal(kernel_count(y[1], N), 1);
    for (i = 0; i < N; i++) {
        char what[64];
        snprintf(what, sizeof what, "kernel %d of %d with its own scalars", i, N);
        compare_tensors(what, y[0][i], y[1][i]);
    }
    for (d = 0; d < 2; d++) {
        for (i = 0; i < N; i++) {
            tb_tensor_release(y[d][i]);
            tb_tensor_release(x[d][i]);
        }
    }
}

/* A batched left operand times a matrix is one matmul whose rows are the batch's rows (the
   matrix read once, as PyTorch's matmul does), in values and in gradients. */
static void test_batched_times_matrix_is_one_matmul(void **state) {
    tb_shape sx = shp(TB_F32, 3, 3, 5, 8, 0), sw = shp(TB_F32, 2, 8, 6, 0, 0);
    tb_tensor *x[2], *w[2], *y[2], *gx[2], *gw[2];
    char *text;
    int d;
    (void)state;
    REQUIRE_OPENCL();
    for (d = 0; d < 2; d++) {
        const tb_device *dev = d ? &g_ocl : &g_cpu;
        tb_tensor *loss, *params[2], *grads[2];
        tb_manual_seed(11);
        x[d] = tb_rand(&sx, dev);
        w[d] = tb_rand(&sw, dev);
        assert_int_equal(tb_set_requires_grad(x[d], true), TB_OK);
        assert_int_equal(tb_set_requires_grad(w[d], true), TB_OK);
        y[d] = tb_matmul(x[d], w[d]);
        assert_non_null(y[d]);
        assert_int_equal(tb_tensor_shape(y[d]).rank, 3);
        assert_int_equal(tb_tensor_shape(y[d]).dims[1], 5);
        assert_int_equal(tb_tensor_shape(y[d]).dims[2], 6);
        if (d == 1) {
            text = tb_ir_backend_text(&y[d], 1);
            assert_non_null(text);
            assert_non_null(strstr(text, "MM_15_6_8"));
            assert_null(strstr(text, "_b3"));
            tb_free(text);
        }
        loss = tb_sum(y[d], NULL, 0, false);
        params[0] = x[d];
        params[1] = w[d];
        assert_int_equal(tb_grad(loss, NULL, params, 2, grads), TB_OK);
        gx[d] = grads[0];
        gw[d] = grads[1];
        tb_tensor_release(loss);
    }
    compare_tensors("batched x times matrix", y[0], y[1]);
    compare_tensors("its gradient for x", gx[0], gx[1]);
    compare_tensors("its gradient for the matrix", gw[0], gw[1]);
    for (d = 0; d < 2; d++) {
        tb_tensor_release(x[d]);
        tb_tensor_release(w[d]);
        tb_tensor_release(y[d]);
        tb_tensor_release(gx[d]);
        tb_tensor_release(gw[d]);
    }
}

/* ---- progress of first compiles ---- */

typedef struct progress_log {
    int count, begins, ends;
    tb_progress events[64];
    char device[64];
} progress_log;

static void record_progress(const tb_progress *p, void *user_data) {
    progress_log *log = (progress_log *)user_data;
    if (log->count < 64) log->events[log->count] = *p;
    log->count++;
    log->begins += p->stage == TB_PROGRESS_BEGIN;
    log->ends += p->stage == TB_PROGRESS_END;
    snprintf(log->device, sizeof log->device, "%s", p->device);
}

/* A graph's first compile reports BEGIN, its kernels as they become ready (never fewer than
   before, never more than its distinct kernels) and END once its first run is done; the same
   graph again, from the computation cache, reports nothing. */
static void test_compile_progress(void **state) {
    static progress_log log;
    tb_desc desc;
    float a[120], got[120];
    tb_shape s = shp(TB_F32, 2, 3, 40, 0, 0);
    tb_tensor *x, *y;
    char want[64];
    int32_t ax = 1;
    int rep, i;
    (void)state;
    REQUIRE_OPENCL();
    tb_shutdown();
    memset(&desc, 0, sizeof desc);
    memset(&log, 0, sizeof log);
    desc.progress.func = record_progress;
    desc.progress.user_data = &log;
    assert_int_equal(tb_setup(&desc), TB_OK);
    fill(a, &s, R_ANY, 0);
    for (rep = 0; rep < 2; rep++) {
        x = tb_tensor_from_host(a, &s, &g_ocl);
        y = tb_exp(x);
        y = take(y, tb_sum(y, &ax, 1, true));
        y = take(y, tb_mul(y, x)); /* a reduction kernel, then an elementwise kernel */
        assert_int_equal(tb_tensor_to_host(y, got, sizeof got), TB_OK);
        if (rep == 0) {
            const int kernels = 2; /* R_3_40 E_120, as in test_debug_lines */
            const tb_progress *last = &log.events[log.count - 1];
            assert_true(log.count >= 3 && log.count < 64);
            assert_int_equal(log.begins, 1);
            assert_int_equal(log.ends, 1);
            assert_int_equal(log.events[0].stage, TB_PROGRESS_BEGIN);
            assert_int_equal(last->stage, TB_PROGRESS_END);
            assert_int_equal(last->status, TB_OK);
            assert_int_equal(last->kernels_total, (size_t)kernels);
            assert_int_equal(last->kernels_done, (size_t)kernels);
            assert_true(last->seconds >= 0.0);
            for (i = 1; i < log.count - 1; i++) {
                assert_int_equal(log.events[i].stage, TB_PROGRESS_KERNELS);
                assert_int_equal(log.events[i].kernels_total, (size_t)kernels);
                assert_true(log.events[i].kernels_done >= log.events[i - 1].kernels_done);
                assert_true(log.events[i].kernels_done <= (size_t)kernels);
                assert_true(log.events[i].seconds >= log.events[i - 1].seconds);
            }
            assert_int_equal(log.events[0].graph_hash, last->graph_hash);
            tb_device_format(&g_ocl, want, sizeof want);
            assert_string_equal(log.device, want);
        } else {
            assert_int_equal(log.begins, 1); /* nothing more: the cache had it */
            assert_int_equal(log.ends, 1);
        }
        tb_tensor_release(x);
        tb_tensor_release(y);
    }
    restart_library();
    probe();
}

/* ---- debug output ---- */

static char g_log[65536];

static void capture_log(tb_log_level level, const char *message, void *user_data) {
    size_t n = strlen(g_log);
    (void)level;
    (void)user_data;
    snprintf(g_log + n, sizeof g_log - n, "%s\n", message);
}

static void test_debug_lines(void **state) {
    tb_desc desc;
    float a[120], got[120];
    tb_shape s = shp(TB_F32, 2, 3, 40, 0, 0);
    tb_tensor *x, *y;
    tb_device dev;
    int32_t ax = 1;
    (void)state;
    REQUIRE_OPENCL();
    tb_shutdown();
    memset(&desc, 0, sizeof desc);
    desc.debug = 2;
    desc.logger.func = capture_log;
    assert_int_equal(tb_setup(&desc), TB_OK);
    g_log[0] = '\0';
    assert_int_equal(tb_device_make("opencl", 0, &dev), TB_OK);
    fill(a, &s, R_ANY, 0);
    x = tb_tensor_from_host(a, &s, &dev);
    y = tb_exp(x);
    y = take(y, tb_sum(y, &ax, 1, true));
    y = take(y, tb_exp(y));
    y = take(y, tb_mul(y, x)); /* reduce kernel, then an elementwise kernel */
    assert_int_equal(tb_tensor_to_host(y, got, sizeof got), TB_OK);
    assert_non_null(strstr(g_log, "2 kernels: R_3_40 E_120"));
    assert_non_null(strstr(g_log, "R_3_40"));
    assert_non_null(strstr(g_log, "GB/s"));
    assert_non_null(strstr(g_log, "GFLOP/s"));
    assert_null(strstr(g_log, "__kernel")); /* the source only from level 3 */
    tb_tensor_release(x);
    tb_tensor_release(y);
    tb_shutdown();
    desc.debug = 3;
    assert_int_equal(tb_setup(&desc), TB_OK);
    g_log[0] = '\0';
    x = tb_tensor_from_host(a, &s, &dev);
    y = tb_sigmoid(x);
    assert_int_equal(tb_tensor_to_host(y, got, sizeof got), TB_OK);
    assert_non_null(strstr(g_log, "__kernel void E_12"));
    tb_tensor_release(x);
    tb_tensor_release(y);
    restart_library();
    probe();
}

/* ---- shutdown with an allocator hook ---- */

/* The opencl backend releases its cached buffers at exit and counts that in the metrics:
   tb_shutdown must give every block back to the hook (three metric entries used to stay,
   to be freed by the next session's allocator). */
static void test_shutdown_with_allocator_hook(void **state) {
    tb_desc desc;
    float a[12], got[12];
    tb_shape s = shp(TB_F32, 2, 3, 4, 0, 0);
    tb_tensor *x, *e, *y;
    tb_device dev;
    char *report;
    int session;
    (void)state;
    REQUIRE_OPENCL();
    fill(a, &s, R_ANY, 0);
    for (session = 0; session < 2; session++) {
        if (session == 0) {
            hook_session();
        } else {
            tb_shutdown();
            memset(&desc, 0, sizeof desc); /* the default allocator */
            g_hook_live = 0;
            assert_int_equal(tb_setup(&desc), TB_OK);
        }
        assert_int_equal(tb_device_make("opencl", 0, &dev), TB_OK);
        x = tb_tensor_from_host(a, &s, &dev);
        e = tb_exp(x);
        y = tb_mul(e, x);
        assert_int_equal(tb_tensor_to_host(y, got, sizeof got), TB_OK);
        tb_tensor_release(x);
        tb_tensor_release(e);
        tb_tensor_release(y);
        report = tb_metrics_report();
        assert_non_null(report);
        tb_free(report);
        tb_metrics_reset();
        tb_shutdown();
        assert_int_equal(g_hook_live, 0);
    }
    restart_library();
    probe();
}

/* A refused allocation while the OpenCL runtime loads is an error of that call only: the next
   call loads it again (a cut-short device list used to stay for the whole session). */
static void test_runtime_load_retried(void **state) {
    size_t expected = 0, count = 0;
    long k;
    (void)state;
    REQUIRE_OPENCL();
    assert_int_equal(tb_backend_devices("opencl", NULL, 0, &expected), TB_OK);
    assert_true(expected > 0);
    for (k = 0;; k++) {
        tb_status st;
        bool refused;
        hook_session();
        hook_arm(k);
        st = tb_opencl_available();
        refused = g_hook_refused != 0;
        hook_arm(-1);
        if (st != TB_OK && st != TB_ERR_OUT_OF_MEMORY) {
            fail_msg("allocation %ld refused: status %d, '%s'", k, (int)st, tb_last_error());
        }
        assert_int_equal(tb_opencl_available(), TB_OK);
        assert_int_equal(tb_backend_devices("opencl", NULL, 0, &count), TB_OK);
        assert_int_equal(count, expected);
        if (!refused) break;
    }
    assert_true(k > 2);
    tb_shutdown();
    assert_int_equal(tb_setup(NULL), TB_OK);
    probe();
}

/* Memory running out while the runtime loads under tb_backend_devices, tb_device_make or
   tb_backend_device_info: an error TB_ERR_OUT_OF_MEMORY (it used to be TB_OK with no device,
   or TB_ERR_UNAVAILABLE "no devices"), or the full answer; and the facts of every device are
   those of a clean load (a refused allocation used to leave a device without a name or
   extensions for the whole session). */
static void test_runtime_load_device_facts(void **state) {
    tb_device_info clean[8], info;
    tb_device devs[8], d;
    size_t expected = 0, count, i;
    int which;
    (void)state;
    REQUIRE_OPENCL();
    assert_int_equal(tb_backend_devices("opencl", devs, 8, &expected), TB_OK);
    assert_true(expected > 0 && expected <= 8);
    for (i = 0; i < expected; i++)
        assert_int_equal(tb_backend_device_info(&devs[i], &clean[i]), TB_OK);
    for (which = 0; which < 3; which++) {
        long k;
        for (k = 0;; k++) {
            tb_status st;
            bool refused;
            const char *what[3] = {"tb_backend_devices", "tb_device_make",
                                   "tb_backend_device_info"};
            hook_session();
            hook_arm(k);
            count = 0;
            if (which == 0) {
                st = tb_backend_devices("opencl", devs, 8, &count);
            } else if (which == 1) {
                st = tb_device_make("opencl", 0, &d);
            } else {
                st = tb_backend_device_info(&g_ocl, &info);
            }
            refused = g_hook_refused != 0;
            hook_arm(-1);
            if (st != TB_OK && (st != TB_ERR_OUT_OF_MEMORY || !refused)) {
                fail_msg("%s, allocation %ld refused: %s '%s'", what[which], k,
                         tb_status_string(st), tb_last_error());
            }
            if (st == TB_OK && which == 0 && count != expected) {
                fail_msg("tb_backend_devices, allocation %ld refused: TB_OK with %zu devices, "
                         "not %zu",
                         k, count, expected);
            }
            assert_int_equal(tb_backend_devices("opencl", devs, 8, &count), TB_OK);
            assert_int_equal(count, expected);
            for (i = 0; i < expected; i++) {
                assert_int_equal(tb_backend_device_info(&devs[i], &info), TB_OK);
                if (strcmp(info.name, clean[i].name) != 0 ||
                    strcmp(info.vendor, clean[i].vendor) != 0 ||
                    strcmp(info.driver_version, clean[i].driver_version) != 0 ||
                    strcmp(info.language_version, clean[i].language_version) != 0 ||
                    strcmp(info.extensions, clean[i].extensions) != 0 ||
                    info.supports_f64 != clean[i].supports_f64) {
                    fail_msg("%s, allocation %ld refused: device %zu is now '%s' (%s, %s, %s), "
                             "not '%s'",
                             what[which], k, i, info.name, info.vendor, info.driver_version,
                             info.language_version, clean[i].name);
                }
            }
            tb_shutdown();
            assert_int_equal(g_hook_live, 0);
            if (!refused) break;
        }
        assert_true(k > 2);
    }
    assert_int_equal(tb_setup(NULL), TB_OK);
    probe();
}

/* A cache folder that is a file: the warning gives that reason, not the errno a successful
   call left behind ("File exists" from the mkdir before it). */
static void test_cache_dir_is_a_file(void **state) {
    char *old = getenv("TB_CACHE_DIR") != NULL ? strdup(getenv("TB_CACHE_DIR")) : NULL;
    char file[64], expected[256];
    tb_desc desc;
    int fd;
    (void)state;
    REQUIRE_OPENCL();
    snprintf(file, sizeof file, "/tmp/tb_cache_file_XXXXXX");
    fd = mkstemp(file);
    assert_true(fd >= 0);
    close(fd);
    setenv("TB_CACHE_DIR", file, 1);
    tb_shutdown();
    memset(&desc, 0, sizeof desc);
    desc.logger.func = capture_log;
    g_log[0] = '\0';
    assert_int_equal(tb_setup(&desc), TB_OK);
    (void)run_fixed_graph();
    snprintf(expected, sizeof expected,
             "opencl: the program cache folder %s is not usable: not a folder\n", file);
    if (strstr(g_log, expected) == NULL) fail_msg("the log: %s", g_log);
    remove(file);
    if (old != NULL) {
        setenv("TB_CACHE_DIR", old, 1);
        free(old);
    } else {
        unsetenv("TB_CACHE_DIR");
    }
    restart_library();
    probe();
}

/* ---- no OpenCL library ---- */

static void test_unavailable_library(void **state) {
    char *old = getenv("TB_OPENCL_LIBRARY") != NULL ? strdup(getenv("TB_OPENCL_LIBRARY")) : NULL;
    tb_device d;
    size_t count = 99;
    float a[3] = {1, 2, 3}, b[3];
    tb_shape s = shp(TB_F32, 1, 3, 0, 0, 0);
    tb_tensor *x, *y;
    const char *names[8];
    size_t n, i;
    bool listed = false;
    (void)state;
#ifdef TB_OPENCL_LINKED
    print_message("built with TB_OPENCL_LINKED: TB_OPENCL_LIBRARY does not apply\n");
    skip();
#endif
    tb_shutdown();
    setenv("TB_OPENCL_LIBRARY", "/nonexistent/libOpenCL.so.1", 1);
    assert_int_equal(tb_setup(NULL), TB_OK);
    /* registered, but reporting why it cannot run */
    n = tb_backend_list(names, 8, true);
    for (i = 0; i < n && i < 8; i++)
        listed = listed || strcmp(names[i], "opencl") == 0;
#ifdef TB_NO_OPENCL
    /* built without the backend: nothing to load */
    assert_false(listed);
    assert_int_equal(tb_opencl_available(), TB_ERR_UNSUPPORTED);
    assert_non_null(strstr(tb_last_error(), "TB_NO_OPENCL"));
    (void)d, (void)count, (void)a, (void)b, (void)s, (void)x, (void)y;
#else
    assert_true(listed);
    assert_int_equal(tb_opencl_available(), TB_ERR_UNAVAILABLE);
    assert_non_null(strstr(tb_last_error(), "opencl: cannot open /nonexistent/libOpenCL.so.1"));
    assert_int_equal(tb_backend_devices("opencl", NULL, 0, &count), TB_OK);
    assert_int_equal(count, 0);
    assert_int_equal(tb_device_make("opencl", 0, &d), TB_ERR_UNAVAILABLE);
    assert_non_null(strstr(tb_last_error(), "opencl"));
    {
        char *report = tb_backend_metrics_report("opencl");
        assert_non_null(report);
        assert_non_null(strstr(report, "cannot open /nonexistent/libOpenCL.so.1"));
        tb_free(report);
    }
    /* the cpu backend keeps working */
    assert_int_equal(tb_device_make("cpu", 0, &d), TB_OK);
    x = tb_tensor_from_host(a, &s, &d);
    y = tb_mul_scalar(x, 3.0);
    assert_int_equal(tb_tensor_to_host(y, b, sizeof b), TB_OK);
    assert_true(b[0] == 3 && b[1] == 6 && b[2] == 9);
    tb_tensor_release(x);
    tb_tensor_release(y);
#endif
    tb_shutdown();
    if (old != NULL) {
        setenv("TB_OPENCL_LIBRARY", old, 1);
        free(old);
    } else {
        unsetenv("TB_OPENCL_LIBRARY");
    }
    assert_int_equal(tb_setup(NULL), TB_OK);
    probe();
}

/* Scalar ops: each brings a scalar parameter (or a constant tensor) into the kernel that
   fuses it. */
enum {
    SOP_MUL,
    SOP_ADD,
    SOP_SUB,
    SOP_DIV,
    SOP_CLAMP,
    SOP_FULL,
    SOP_ONES,
    SOP_SCALAR,
    SOP_ROW,
    SOP_COUNT
};

static tb_tensor *scalar_op(tb_tensor *x, int op, double c) {
    tb_shape s = tb_tensor_shape(x);
    tb_device dev = tb_tensor_device(x);
    tb_tensor *k = NULL, *y;
    switch (op) {
    case SOP_MUL:
        return tb_mul_scalar(x, c);
    case SOP_ADD:
        return tb_add_scalar(x, c);
    case SOP_SUB:
        return tb_sub_scalar(x, c);
    case SOP_DIV:
        return tb_div_scalar(x, c);
    case SOP_CLAMP:
        return tb_clamp(x, -c, c);
    case SOP_FULL:
        k = tb_full(&s, c, &dev);
        y = tb_mul(x, k);
        break;
    case SOP_ONES:
        k = tb_ones(&s, &dev);
        y = tb_add(x, k);
        break;
    case SOP_SCALAR:
        k = tb_scalar_tensor(tb_scalar_f(TB_F32, c), &dev);
        y = tb_add(x, k);
        break;
    default: { /* a constant row, broadcast */
        tb_shape row = s;
        if (row.rank > 0) {
            row.rank = 1;
            row.dims[0] = s.dims[s.rank - 1];
        }
        k = tb_full(&row, c, &dev);
        y = tb_mul(x, k);
        break;
    }
    }
    tb_tensor_release(k);
    return y;
}

typedef struct scalar_chain {
    int op[3];
    double c[3];
    int n;
} scalar_chain;

static tb_tensor *apply_chain(tb_tensor *x, const scalar_chain *ch) {
    tb_tensor *y = tb_tensor_retain(x);
    int i;
    for (i = 0; i < ch->n; i++)
        y = take(y, scalar_op(y, ch->op[i], ch->c[i]));
    return y;
}

/* Constants near 1 keep products and exponentials in range. */
static void random_chain(scalar_chain *ch, int min_ops) {
    int i;
    ch->n = min_ops + (int)rnd_int(0, 2 - min_ops);
    for (i = 0; i < ch->n; i++) {
        ch->op[i] = (int)rnd_int(0, SOP_COUNT - 1);
        ch->c[i] = 0.5 + (double)rnd_int(0, 8) / 8.0;
    }
}

enum {
    SF_SUM,
    SF_MEAN,
    SF_MAX,
    SF_MIN,
    SF_PROD,
    SF_ARGMAX,
    SF_ARGMIN,
    SF_SOFTMAX,
    SF_LOG_SOFTMAX,
    SF_LAYER_NORM,
    SF_MATMUL_A,
    SF_MATMUL_B,
    SF_MATMUL_EPILOGUE,
    SF_COUNT
};

static const char *const sf_names[SF_COUNT] = {
    "sum",     "mean",        "max",        "min",      "prod",     "argmax",         "argmin",
    "softmax", "log_softmax", "layer_norm", "matmul a", "matmul b", "matmul epilogue"};

typedef struct sf_arg {
    int consumer;
    scalar_chain pro, pro_b, epi, on_weight, on_bias;
    int32_t axis;
    bool all_axes, keepdim;
    int32_t norm_ndim;
    bool weight, bias;
} sf_arg;

/* in[0] is x; layer_norm takes weight and bias from in[1] and in[2], matmul b from in[1]. */
static tb_tensor *build_scalar_feed(tb_tensor **in, const void *arg) {
    const sf_arg *a = (const sf_arg *)arg;
    tb_tensor *x = apply_chain(in[0], &a->pro), *y = NULL;
    const int32_t *axes = a->all_axes ? NULL : &a->axis;
    size_t num_axes = a->all_axes ? 0 : 1;
    switch (a->consumer) {
    case SF_SUM:
        y = tb_sum(x, axes, num_axes, a->keepdim);
        break;
    case SF_MEAN:
        y = tb_mean(x, axes, num_axes, a->keepdim);
        break;
    case SF_MAX:
        y = tb_max(x, axes, num_axes, a->keepdim);
        break;
    case SF_MIN:
        y = tb_min(x, axes, num_axes, a->keepdim);
        break;
    case SF_PROD:
        y = tb_prod(x, axes, num_axes, a->keepdim);
        break;
    case SF_ARGMAX:
        y = tb_argmax(x, a->axis, a->keepdim);
        break;
    case SF_ARGMIN:
        y = tb_argmin(x, a->axis, a->keepdim);
        break;
    case SF_SOFTMAX:
        y = tb_softmax(x, a->axis);
        break;
    case SF_LOG_SOFTMAX:
        y = tb_log_softmax(x, a->axis);
        break;
    case SF_LAYER_NORM: {
        tb_tensor *w = a->weight ? apply_chain(in[1], &a->on_weight) : NULL;
        tb_tensor *b = a->bias ? apply_chain(in[2], &a->on_bias) : NULL;
        y = tb_layer_norm(x, a->norm_ndim, w, b, 1e-5);
        tb_tensor_release(w);
        tb_tensor_release(b);
        break;
    }
    default: { /* matmul: the chains on a (pro) and b (pro_b) are empty where not wanted */
        tb_tensor *b = apply_chain(in[1], &a->pro_b);
        y = tb_matmul(x, b);
        tb_tensor_release(b);
        break;
    }
    }
    tb_tensor_release(x);
    return take(y, apply_chain(y, &a->epi));
}

/* A random long dim now and then: CPU reductions then take several accumulators, GPU code
   work-groups. */
static int64_t random_dim(void) {
    return rnd_u32() % 4 == 0 ? rnd_int(33, 70) : rnd_int(1, 5);
}

/* One random case of a consumer. */
static void scalar_feed_case(sf_arg *a, int consumer, const char *tag) {
    input in[3];
    char name[128];
    int32_t rank = (int32_t)rnd_int(1, 3), i;
    int64_t d[3];
    memset(a, 0, sizeof *a);
    a->consumer = consumer;
    for (i = 0; i < 3; i++)
        d[i] = consumer == SF_PROD ? rnd_int(1, 5) : random_dim();
    random_chain(&a->pro, consumer < SF_MATMUL_B ? 1 : 0);
    random_chain(&a->epi, consumer == SF_MATMUL_EPILOGUE ? 1 : 0);
    a->axis = (int32_t)rnd_int(-rank, rank - 1);
    a->all_axes = consumer <= SF_MIN && rnd_u32() % 4 == 0; /* prod: 5 factors at most */
    a->keepdim = rnd_u32() % 2 == 0;
    in[0] = in_of(shp(TB_F32, rank, d[0], d[1], d[2], 0), R_ANY);
    in[1] = in[2] = in[0];
    if (consumer == SF_LAYER_NORM) {
        a->norm_ndim = rank > 1 ? (int32_t)rnd_int(1, 2) : 1;
        a->weight = rnd_u32() % 2 == 0;
        a->bias = rnd_u32() % 2 == 0;
        random_chain(&a->on_weight, 0);
        random_chain(&a->on_bias, 0);
        if (a->norm_ndim == 1) {
            in[1] = in_of(shp(TB_F32, 1, d[rank - 1], 0, 0, 0), R_ANY);
        } else {
            in[1] = in_of(shp(TB_F32, 2, d[rank - 2], d[rank - 1], 0, 0), R_ANY);
        }
        in[2] = in[1];
    } else if (consumer >= SF_MATMUL_A) {
        int64_t n = random_dim();
        if (consumer != SF_MATMUL_A) random_chain(&a->pro_b, consumer == SF_MATMUL_B ? 1 : 0);
        if (rank == 1) {
            in[1] = in_of(shp(TB_F32, 2, d[0], n, 0, 0), R_ANY);
        } else {
            in[1] = in_of(shp(TB_F32, 2, d[rank - 1], n, 0, 0), R_ANY);
        }
    }
    snprintf(name, sizeof name, "%s%s fed by %d scalar op%s (rank %d)", tag, sf_names[consumer],
             a->pro.n + a->pro_b.n, a->pro.n + a->pro_b.n == 1 ? "" : "s", (int)rank);
    add_case(name, build_scalar_feed, a, in, 3);
}

static tb_tensor *build_ln_of_scalar(tb_tensor **in, const void *arg) {
    int which = *(const int *)arg;
    tb_tensor *h, *w = NULL, *y;
    if (which == 0) {
        h = tb_mul_scalar(in[0], 0.5);
    } else if (which == 1) {
        h = tb_add_scalar(in[0], 1);
    } else {
        tb_shape ws = shp(TB_F32, 1, 4, 0, 0, 0);
        tb_device dev = tb_tensor_device(in[0]);
        h = tb_tensor_retain(in[0]);
        w = tb_ones(&ws, &dev);
    }
    y = tb_layer_norm(h, 1, w, NULL, 1e-5);
    tb_tensor_release(h);
    tb_tensor_release(w);
    return y;
}

static void test_scalar_feeds_every_kernel_kind(void **state) {
    static const int ln_which[3] = {0, 1, 2};
    static sf_arg args[SF_COUNT * 5];
    size_t n = 0;
    int c, round;
    input in[1];
    (void)state;
    REQUIRE_OPENCL();
    /* the reported graphs: layer_norm of x * 0.5, of x + 1, with a ones weight */
    in[0] = in_of(shp(TB_F32, 2, 2, 4, 0, 0), R_ANY);
    add_case("layer_norm(x * 0.5)", build_ln_of_scalar, &ln_which[0], in, 1);
    flush_cases_direct();
    add_case("layer_norm(x + 1)", build_ln_of_scalar, &ln_which[1], in, 1);
    flush_cases_direct();
    add_case("layer_norm(x, ones)", build_ln_of_scalar, &ln_which[2], in, 1);
    flush_cases_direct();
    g_rng = 0x5CA1A2F00Dull;
    for (round = 0; round < 4; round++) {
        /* the last round renders the GPU code (work-groups, local-memory tiles) */
#ifndef TB_NO_OPENCL
        tb__ocl_codegen_as_gpu = round == 3;
#endif
        tb_computation_cache_clear();
        /* one graph a round, each round led by other consumers: the scalars of the first
           cases are the graph's first parameters, with the smallest argument names */
        for (c = 0; c < SF_COUNT; c++)
            scalar_feed_case(&args[n++], (c + 5 * round) % SF_COUNT,
                             round == 3 ? "GPU code: " : "");
        flush_cases_direct();
    }
#ifndef TB_NO_OPENCL
    tb__ocl_codegen_as_gpu = 0;
#endif
    tb_computation_cache_clear();
    /* long rows: split reductions and packed matmul operands */
    {
        sf_arg *a;
        input big[3];
        for (c = SF_SUM; c <= SF_MIN; c++) {
            a = &args[n++];
            memset(a, 0, sizeof *a);
            a->consumer = c;
            a->axis = 1;
            a->pro.n = 2;
            a->pro.op[0] = SOP_MUL;
            a->pro.c[0] = 0.75;
            a->pro.op[1] = c == SF_SUM ? SOP_ROW : SOP_ADD;
            a->pro.c[1] = 1.25;
            a->epi.n = 1;
            a->epi.op[0] = SOP_SUB;
            a->epi.c[0] = 0.5;
            big[0] = in_of(shp(TB_F32, 2, 2, 20000, 0, 0), R_ANY);
            add_case("split reduction fed by scalar ops", build_scalar_feed, a, big, 1);
        }
        flush_cases_direct();
        for (c = SF_MATMUL_A; c <= SF_MATMUL_EPILOGUE; c++) {
            a = &args[n++];
            memset(a, 0, sizeof *a);
            a->consumer = c;
            a->pro.n = c != SF_MATMUL_B;
            a->pro.op[0] = SOP_SCALAR;
            a->pro.c[0] = 0.25;
            a->pro_b.n = c != SF_MATMUL_A;
            a->pro_b.op[0] = SOP_DIV;
            a->pro_b.c[0] = 1.5;
            a->epi.n = 2;
            a->epi.op[0] = SOP_CLAMP;
            a->epi.c[0] = 4;
            a->epi.op[1] = SOP_FULL;
            a->epi.c[1] = 0.5;
            big[0] = in_of(shp(TB_F32, 2, 64, 64, 0, 0), R_ANY);
            big[1] = in_of(shp(TB_F32, 2, 64, 64, 0, 0), R_ANY);
            add_case("packed matmul fed by scalar ops", build_scalar_feed, a, big, 2);
        }
        flush_cases_direct();
    }
}

/* ---- scalar arguments of every value ---- */

typedef struct special_arg {
    int which;
    double value;
} special_arg;

static tb_tensor *build_special(tb_tensor **in, const void *arg) {
    const special_arg *a = (const special_arg *)arg;
    tb_shape s = tb_tensor_shape(in[0]);
    tb_device dev = tb_tensor_device(in[0]);
    tb_tensor *k, *y;
    switch (a->which) {
    case 0:
        return tb_add_scalar(in[0], a->value);
    case 1:
        return tb_mul_scalar(in[0], a->value);
    case 2:
        return tb_div_scalar(in[0], a->value);
    case 3: /* a parameter of the input's own dtype (integer dtypes included) */
        k = tb_scalar_tensor(tb_scalar_f(s.dtype, a->value), &dev);
        y = tb_add(in[0], k);
        break;
    default: /* a constant tensor of the input's dtype */
        k = tb_full(&s, a->value, &dev);
        y = tb_mul(in[0], k);
        break;
    }
    tb_tensor_release(k);
    return y;
}

/* NaN, infinities and values beyond the int64 range as scalar arguments of kernels (eight
   cases to a kernel, so they are kernel arguments; thirty, so they are a table) and as
   scalar tensors read back: the same values as the cpu backend, with no undefined
   conversion on the way (the undefined-behaviour sanitizer checks that). */
static void test_scalar_special_values(void **state) {
    static const double values[] = {
        NAN, INFINITY, -INFINITY, 1e30, -9223372036854775808.0, 9223372036854775808.0};
    static const tb_dtype dtypes[] = {TB_F32, TB_F64, TB_I32, TB_I64};
    static special_arg args[5 * 6];
    size_t di, vi, n = 0;
    int which, pass;
    (void)state;
    REQUIRE_OPENCL();
    for (pass = 0; pass < 2; pass++) {
        for (di = 0; di < 4; di++) {
            input in[1];
            n = 0;
            in[0] = in_of(shp(dtypes[di], 1, 6, 0, 0, 0), R_ANY);
            for (vi = 0; vi < 6; vi++) {
                for (which = 0; which < 5; which++) {
                    special_arg *a = &args[n++];
                    char name[128];
                    /* an integer full of a value it cannot hold is an error on both */
                    if (which == 4 && !tb_dtype_is_float(dtypes[di])) continue;
                    a->which = which;
                    a->value = values[vi];
                    snprintf(name, sizeof name, "%s %d with %g", tb_dtype_name(dtypes[di]), which,
                             values[vi]);
                    add_case(name, build_special, a, in, 1);
                    if (pass == 0 && g_num_cases == 8) flush_cases();
                }
            }
            flush_cases();
        }
    }
    for (di = 0; di < 4; di++) {
        for (vi = 0; vi < 6; vi++) {
            tb_tensor *r = tb_scalar_tensor(tb_scalar_f(dtypes[di], values[vi]), &g_cpu);
            tb_tensor *g = tb_scalar_tensor(tb_scalar_f(dtypes[di], values[vi]), &g_ocl);
            char name[64];
            snprintf(name, sizeof name, "scalar tensor %s %g", tb_dtype_name(dtypes[di]),
                     values[vi]);
            compare_tensors(name, r, g);
            tb_tensor_release(r);
            tb_tensor_release(g);
        }
    }
}

/* ---- allocation failures while a program is made ---- */

typedef struct failing_allocator {
    long count, fail_at; /* fail_at > 0: the fail_at-th allocation from now returns NULL */
    bool failed;
} failing_allocator;

static failing_allocator g_failing;

static void *failing_alloc(size_t size, void *user_data) {
    failing_allocator *a = (failing_allocator *)user_data;
    if (a->fail_at > 0 && ++a->count == a->fail_at) {
        a->failed = true;
        return NULL;
    }
    return malloc(size);
}

static void failing_free(void *ptr, void *user_data) {
    (void)user_data;
    free(ptr);
}

/* A 3x3 -> 5x5 pad, and the n-th allocation of its sync fails, for every n until the sync
   needs fewer: each sync lowers and generates the program anew (the computation cache is
   cleared) and gives either TB_ERR_OUT_OF_MEMORY or exactly the right values; the same
   graph right after, and after the sweep, gives the right values (nothing half-built was
   cached). */
static void test_pad_allocation_failures(void **state) {
    char *old = getenv("TB_CACHE_DIR") != NULL ? strdup(getenv("TB_CACHE_DIR")) : NULL;
    static const int64_t pads[4] = {1, 1, 1, 1};
    float host[9], want[25], got[25];
    tb_shape s = shp(TB_F32, 2, 3, 3, 0, 0);
    tb_desc desc;
    tb_tensor *x, *y;
    long n, errors = 0;
    int i;
    (void)state;
    REQUIRE_OPENCL();
    for (i = 0; i < 9; i++)
        host[i] = (float)i + 1.0f;
    for (i = 0; i < 25; i++) {
        int r = i / 5 - 1, c = i % 5 - 1;
        want[i] = (r >= 0 && r < 3 && c >= 0 && c < 3) ? host[r * 3 + c] : -2.5f;
    }
    setenv("TB_CACHE_DIR", "off", 1);
    tb_shutdown();
    memset(&g_failing, 0, sizeof g_failing);
    memset(&desc, 0, sizeof desc);
    desc.allocator.alloc = failing_alloc;
    desc.allocator.free = failing_free;
    desc.allocator.user_data = &g_failing;
    assert_int_equal(tb_setup(&desc), TB_OK);
    for (n = 1;; n++) {
        tb_status st;
        if (n > 100000) fail_msg("the sweep does not end");
        tb_computation_cache_clear();
        x = tb_tensor_from_host(host, &s, &g_ocl);
        y = tb_pad(x, pads, 4, -2.5);
        assert_non_null(y);
        g_failing.count = 0;
        g_failing.failed = false;
        g_failing.fail_at = n;
        st = tb_sync(&y, 1);
        g_failing.fail_at = 0;
        if (st != TB_OK) {
            if (!g_failing.failed)
                fail_msg("allocation %ld: tb_sync failed: %s", n, tb_last_error());
            if (st != TB_ERR_OUT_OF_MEMORY) {
                fail_msg("allocation %ld failed: tb_sync gave %s, not TB_ERR_OUT_OF_MEMORY: %s", n,
                         tb_status_string(st), tb_last_error());
            }
            errors++;
        } else {
            assert_int_equal(tb_tensor_to_host(y, got, sizeof got), TB_OK);
            if (memcmp(got, want, sizeof got) != 0)
                fail_msg("allocation %ld failed: tb_sync gave TB_OK and wrong values", n);
        }
        tb_tensor_release(y);
        y = tb_pad(x, pads, 4, -2.5);
        if (tb_tensor_to_host(y, got, sizeof got) != TB_OK) fail_msg("%s", tb_last_error());
        if (memcmp(got, want, sizeof got) != 0)
            fail_msg("after allocation %ld failed: the same graph gives wrong values", n);
        tb_tensor_release(y);
        tb_tensor_release(x);
        if (st == TB_OK && !g_failing.failed) break;
    }
    assert_true(errors > 0);
    if (old != NULL) {
        setenv("TB_CACHE_DIR", old, 1);
        free(old);
    } else {
        unsetenv("TB_CACHE_DIR");
    }
    restart_library();
    probe();
    x = tb_tensor_from_host(host, &s, &g_ocl);
    y = tb_pad(x, pads, 4, -2.5);
    assert_int_equal(tb_tensor_to_host(y, got, sizeof got), TB_OK);
    assert_memory_equal(got, want, sizeof got);
    tb_tensor_release(y);
    tb_tensor_release(x);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unary),
        cmocka_unit_test(test_cast_and_not),
        cmocka_unit_test(test_binary),
        cmocka_unit_test(test_scalar_operands_and_ternary),
        cmocka_unit_test(test_reductions),
        cmocka_unit_test(test_argmax_nan_and_ties),
        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_matmul_through_reshape),
        cmocka_unit_test(test_matmul_vector_epilogue),
        cmocka_unit_test(test_elementwise_rows),
        cmocka_unit_test(test_softmax_layer_norm),
        cmocka_unit_test(test_movement),
        cmocka_unit_test(test_concat_pad_gather),
        cmocka_unit_test(test_conv_pool),
        cmocka_unit_test(test_concat_many_inputs),
        cmocka_unit_test(test_concat_many_inputs_large),
        cmocka_unit_test(test_concat_many_inputs_grad),
        cmocka_unit_test(test_generators),
        cmocka_unit_test(test_edge_shapes),
        cmocka_unit_test(test_rand_bit_identical),
        cmocka_unit_test(test_custom_ops),
        cmocka_unit_test(test_custom_op_without_expr_falls_back),
        cmocka_unit_test(test_fusion_patterns),
        cmocka_unit_test(test_dot_clusters),
        cmocka_unit_test(test_dumps_under_allocation_failures),
        cmocka_unit_test(test_max_min_nan_large),
        cmocka_unit_test(test_vector_exp),
        cmocka_unit_test(test_erf_gelu_f32),
        cmocka_unit_test(test_vector_where_mask),
        cmocka_unit_test(test_norm_rows_streamed),
        cmocka_unit_test(test_vector_reduce_broadcast_operand),
        cmocka_unit_test(test_vector_operand_relations),
        cmocka_unit_test(test_matmul_core_key_table_growth),
        cmocka_unit_test(test_random_wide_graphs),
        cmocka_unit_test(test_matmul_reads_a_in_place),
        cmocka_unit_test(test_kept_panels_follow_their_buffer),
        cmocka_unit_test(test_long_chain_splits),
        cmocka_unit_test(test_many_arguments_split),
        cmocka_unit_test(test_scalars_do_not_recompile),
        cmocka_unit_test(test_random_graphs),
        cmocka_unit_test(test_run_time_errors),
        cmocka_unit_test(test_run_time_error_reports_one_item),
        cmocka_unit_test(test_scalar_feeds_every_kernel_kind),
        cmocka_unit_test(test_scalar_special_values),
        cmocka_unit_test(test_pad_allocation_failures),
        cmocka_unit_test(test_small_reductions_inline),
        cmocka_unit_test(test_repeated_kernels_once),
        cmocka_unit_test(test_repeated_kernels_other_scalars),
        cmocka_unit_test(test_compile_progress),
        cmocka_unit_test(test_batched_times_matrix_is_one_matmul),
    };
    /* OpenCL's own machinery: devices, program caches, the loader */
    const struct CMUnitTest opencl_tests[] = {
        cmocka_unit_test(test_transfers),
        cmocka_unit_test(test_devices),
        cmocka_unit_test(test_gpu_code_paths),
        cmocka_unit_test(test_concat_many_inputs_gpu),
        cmocka_unit_test(test_custom_op_compile_error),
        cmocka_unit_test(test_dot_compile_error_plain),
        cmocka_unit_test(test_allocation_too_large),
        cmocka_unit_test(test_two_devices),
        cmocka_unit_test(test_two_devices_run_at_once),
        cmocka_unit_test(test_disk_cache_left_to_pocl),
        cmocka_unit_test(test_disk_cache),
        cmocka_unit_test(test_disk_cache_forged_entry),
        cmocka_unit_test(test_disk_cache_fifo_entry),
        cmocka_unit_test(test_disk_cache_symlinks),
        cmocka_unit_test(test_disk_cache_private_folder),
        cmocka_unit_test(test_program_cache_key_collision),
        cmocka_unit_test(test_debug_lines),
        cmocka_unit_test(test_shutdown_with_allocator_hook),
        cmocka_unit_test(test_cache_dir_is_a_file),
        cmocka_unit_test(test_runtime_load_retried),
        cmocka_unit_test(test_runtime_load_device_facts),
        cmocka_unit_test(test_unavailable_library),
    };
    int failed;
    if (getenv("TB_TEST_FILTER") != NULL) cmocka_set_test_filter(getenv("TB_TEST_FILTER"));
    failed = cmocka_run_group_tests(tests, group_setup, group_teardown);
    if (TEST_OPENCL) failed += cmocka_run_group_tests(opencl_tests, group_setup, group_teardown);
    return failed;
}
