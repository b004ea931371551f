/* The f16 and bf16 cases of tests/half_torch.py (PyTorch's conversions and op results), read
   once and run on a device: shared by tests/test_half.c and tests/test_half_opencl.c. The
   including file defines TB_IMPLEMENTATION and includes cmocka and the header first.

   Each case states how close a result must be (tests/half_torch.py says why): within ULPS
   units in the last place of its reference at each element (0: the same bits), and, where the
   oracle also gives PyTorch's own 16-bit kernel's result (which differs by instruction set),
   within that line's units at the output's scale. TB_HALF_ORACLE_PREFIX, a shell command
   prefix, runs the oracle under another command: "qemu-x86_64 -cpu EPYC-Milan" gives
   PyTorch's AVX2 kernels on any x86 machine (tools/test_half_isa.sh). TB_HALF_VERBOSE=1
   prints each case's largest difference on each device. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define HALF_MAX_IN 3

typedef struct half_tensor {
    tb_shape shape;
    void *data;
    size_t nbytes;
} half_tensor;

typedef struct half_case {
    char name[64], op[32], arg[32];
    half_tensor in[HALF_MAX_IN];
    int num_in;
    half_tensor out;    /* the reference */
    int ulps;           /* at each element, from `out` */
    half_tensor native; /* PyTorch's own 16-bit kernel's result; data NULL where none */
    int native_ulps;    /* from `native`, in units at the output's scale */
    bool ended;
} half_case;

typedef struct half_oracle {
    bool loaded;
    bool broken; /* the oracle ran and failed, or gave output that cannot be trusted */
    char why[256];
    uint32_t h2f[2][65536]; /* f16, bf16 */
    uint32_t *f2h_in[2];
    uint16_t *f2h_out[2];
    size_t f2h_count[2], f2h_cap[2];
    half_case *cases;
    size_t num_cases, cap_cases;
} half_oracle;

static half_oracle g_half;

static int half_dtype_index(const char *name) {
    return strcmp(name, "f16") == 0 ? 0 : strcmp(name, "bf16") == 0 ? 1 : -1;
}

/* A whole token as a decimal integer in [lo, hi]. */
static bool half_parse_int(const char *tok, long lo, long hi, long *v) {
    char *end;
    if (tok == NULL || *tok == '\0') return false;
    *v = strtol(tok, &end, 10);
    return *end == '\0' && *v >= lo && *v <= hi;
}

/* A whole token as at most `digits` hexadecimal digits. */
static bool half_parse_hex(const char *tok, size_t digits, uint64_t *v) {
    size_t len = tok ? strlen(tok) : 0;
    if (len == 0 || len > digits || strspn(tok, "0123456789abcdefABCDEF") != len) return false;
    *v = strtoull(tok, NULL, 16);
    return true;
}

/* The rest of a tensor line, "f16 2 3 4 HEX...", from strtok_r's state into t (which must be
   empty); false on a malformed line: a bad number, too few or too many values. */
static bool half_parse_tensor(char **save, half_tensor *t) {
    char *tok = strtok_r(NULL, " \n", save);
    int64_t dims[TB_MAX_RANK], n = 1, i;
    long rank, d;
    tb_dtype dt;
    size_t es;
    if (t->data != NULL || tok == NULL || tb_dtype_parse(tok, &dt) != TB_OK) return false;
    if (!half_parse_int(strtok_r(NULL, " \n", save), 0, TB_MAX_RANK, &rank)) return false;
    for (d = 0; d < rank; d++) {
        long dim;
        if (!half_parse_int(strtok_r(NULL, " \n", save), 0, 1L << 24, &dim)) return false;
        dims[d] = dim;
        n *= dims[d];
    }
    if (tb_shape_make(&t->shape, dt, (int32_t)rank, dims) != TB_OK) return false;
    es = tb_dtype_size(dt);
    t->nbytes = (size_t)n * es;
    t->data = calloc((size_t)n + 1, es);
    if (t->data == NULL) return false;
    for (i = 0; i < n; i++) {
        uint64_t u;
        if (!half_parse_hex(strtok_r(NULL, " \n", save), 2 * es, &u)) return false;
        if (es == 2) {
            uint16_t h = (uint16_t)u;
            memcpy((char *)t->data + i * 2, &h, 2);
        } else if (es == 4) {
            uint32_t w = (uint32_t)u;
            memcpy((char *)t->data + i * 4, &w, 4);
        } else {
            memcpy((char *)t->data + i * 8, &u, 8);
        }
    }
    return strtok_r(NULL, " \n", save) == NULL;
}

static bool half_grow(void **p, size_t *cap, size_t need, size_t size) {
    void *q;
    size_t c;
    if (need <= *cap) return true;
    c = *cap ? *cap * 2 : 256;
    while (c < need)
        c *= 2;
    q = realloc(*p, c * size);
    if (q == NULL) return false;
    *p = q;
    *cap = c;
    return true;
}

/* "case NAME OP ARG ULPS" */
static bool half_parse_case(char **save, half_case *hc) {
    char *name = strtok_r(NULL, " \n", save), *op = strtok_r(NULL, " \n", save);
    char *arg = strtok_r(NULL, " \n", save);
    long ulps;
    if (name == NULL || op == NULL || arg == NULL || strlen(name) >= sizeof hc->name ||
        strlen(op) >= sizeof hc->op || strlen(arg) >= sizeof hc->arg)
        return false;
    strcpy(hc->name, name);
    strcpy(hc->op, op);
    strcpy(hc->arg, arg);
    if (!half_parse_int(strtok_r(NULL, " \n", save), 0, 64, &ulps)) return false;
    hc->ulps = (int)ulps;
    return strtok_r(NULL, " \n", save) == NULL;
}

static bool half_read_line(half_oracle *o, char *line) {
    char *save = NULL, *tag = strtok_r(line, " \n", &save);
    half_case *hc = o->num_cases ? &o->cases[o->num_cases - 1] : NULL;
    if (tag == NULL) return false;
    if (strcmp(tag, "h2f") == 0 || strcmp(tag, "f2h") == 0) {
        /* "h2f DTYPE H F" and "f2h DTYPE F H": 16-bit patterns in 4 digits, f32 ones in 8 */
        bool h2f = tag[0] == 'h';
        const char *name = strtok_r(NULL, " \n", &save);
        int k = name ? half_dtype_index(name) : -1;
        uint64_t from, to;
        if (k < 0 || !half_parse_hex(strtok_r(NULL, " \n", &save), h2f ? 4 : 8, &from) ||
            !half_parse_hex(strtok_r(NULL, " \n", &save), h2f ? 8 : 4, &to) ||
            strtok_r(NULL, " \n", &save) != NULL)
            return false;
        if (h2f) {
            o->h2f[k][from] = (uint32_t)to;
            return true;
        }
        if (o->f2h_count[k] == o->f2h_cap[k]) {
            size_t cap = o->f2h_cap[k];
            uint16_t *grown;
            if (!half_grow((void **)&o->f2h_in[k], &cap, cap + 1, 4)) return false;
            grown = (uint16_t *)realloc(o->f2h_out[k], cap * 2);
            if (grown == NULL) return false;
            o->f2h_out[k] = grown;
            o->f2h_cap[k] = cap;
        }
        o->f2h_in[k][o->f2h_count[k]] = (uint32_t)from;
        o->f2h_out[k][o->f2h_count[k]++] = (uint16_t)to;
        return true;
    }
    if (strcmp(tag, "case") == 0) {
        if (hc != NULL && !hc->ended) return false;
        if (!half_grow((void **)&o->cases, &o->cap_cases, o->num_cases + 1, sizeof *o->cases))
            return false;
        hc = &o->cases[o->num_cases++];
        memset(hc, 0, sizeof *hc);
        return half_parse_case(&save, hc);
    }
    if (hc == NULL || hc->ended) return false; /* every other line belongs to an open case */
    if (strcmp(tag, "in") == 0) {
        if (hc->num_in >= HALF_MAX_IN || hc->out.data != NULL) return false;
        return half_parse_tensor(&save, &hc->in[hc->num_in++]);
    }
    if (strcmp(tag, "out") == 0) return hc->num_in > 0 && half_parse_tensor(&save, &hc->out);
    if (strcmp(tag, "native") == 0) {
        long ulps;
        if (hc->out.data == NULL || !half_parse_int(strtok_r(NULL, " \n", &save), 0, 1024, &ulps) ||
            !half_parse_tensor(&save, &hc->native))
            return false;
        hc->native_ulps = (int)ulps;
        return tb_shape_equal(&hc->native.shape, &hc->out.shape) &&
               (hc->out.shape.dtype == TB_F16 || hc->out.shape.dtype == TB_BF16);
    }
    if (strcmp(tag, "end") == 0 && strtok_r(NULL, " \n", &save) == NULL && hc->out.data) {
        hc->ended = true;
        return true;
    }
    return false;
}

/* Runs the oracle once (under TB_HALF_ORACLE_PREFIX where set); g_half.why says why it is not
   loaded, g_half.broken whether that is a failure (not merely no PyTorch here). The oracle's
   standard error stays the test's. */
static void half_load(void) {
    FILE *p;
    char *line = NULL, command[512];
    const char *prefix = getenv("TB_HALF_ORACLE_PREFIX");
    size_t cap = 0;
    ssize_t len;
    bool ok = true;
    int status;
    if (g_half.loaded || g_half.why[0] != '\0') return;
    if (access("/usr/bin/python3", X_OK) != 0) {
        snprintf(g_half.why, sizeof g_half.why, "no /usr/bin/python3");
        return;
    }
    if (prefix == NULL) prefix = "";
    if ((size_t)snprintf(command, sizeof command, "%s /usr/bin/python3 tests/half_torch.py",
                         prefix) >= sizeof command) {
        snprintf(g_half.why, sizeof g_half.why, "TB_HALF_ORACLE_PREFIX is too long");
        g_half.broken = true;
        return;
    }
    p = popen(command, "r");
    if (p == NULL) {
        snprintf(g_half.why, sizeof g_half.why, "popen failed");
        g_half.broken = true;
        return;
    }
    while ((len = getline(&line, &cap, p)) > 0) {
        char shown[121]; /* the line's start, as the parser leaves it cut into tokens */
        size_t k = (size_t)len < sizeof shown - 1 ? (size_t)len : sizeof shown - 1;
        if (strncmp(line, "torch-unavailable", 17) == 0) {
            snprintf(g_half.why, sizeof g_half.why, "%.200s", line);
            ok = false;
            break;
        }
        memcpy(shown, line, k);
        shown[k] = '\0';
        shown[strcspn(shown, "\n")] = '\0';
        if (ok && !half_read_line(&g_half, line)) {
            snprintf(g_half.why, sizeof g_half.why, "bad oracle line: %s", shown);
            ok = false;
        }
    }
    free(line);
    status = pclose(p);
    if (status != 0 && ok) {
        snprintf(g_half.why, sizeof g_half.why, "'%.200s' failed (exit status %d)", command,
                 WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        ok = false;
    }
    if (ok && g_half.num_cases > 0 && !g_half.cases[g_half.num_cases - 1].ended) {
        snprintf(g_half.why, sizeof g_half.why, "the oracle's output ends inside case %s",
                 g_half.cases[g_half.num_cases - 1].name);
        ok = false;
    }
    g_half.loaded = ok && g_half.num_cases > 0;
    if (ok && !g_half.loaded) snprintf(g_half.why, sizeof g_half.why, "the oracle gave no cases");
    g_half.broken = !g_half.loaded && strncmp(g_half.why, "torch-unavailable", 17) != 0;
}

/* The oracle for a test: skips the test where PyTorch cannot be imported (or there is no
   /usr/bin/python3), fails it where the oracle ran and failed or printed a malformed line. */
static void half_need(void) {
    half_load();
    if (g_half.loaded) return;
    print_message("PyTorch's results are not available: %s\n", g_half.why);
    if (g_half.broken) fail();
    skip();
}

static void half_free(void) {
    size_t i;
    int k;
    for (i = 0; i < g_half.num_cases; i++) {
        for (k = 0; k < g_half.cases[i].num_in; k++)
            free(g_half.cases[i].in[k].data);
        free(g_half.cases[i].out.data);
        free(g_half.cases[i].native.data);
    }
    free(g_half.cases);
    for (k = 0; k < 2; k++) {
        free(g_half.f2h_in[k]);
        free(g_half.f2h_out[k]);
    }
    memset(&g_half, 0, sizeof g_half);
}

/* ---- running a case ---- */

typedef tb_tensor *(*half_unary_fn)(tb_tensor *);
typedef tb_tensor *(*half_binary_fn)(tb_tensor *, tb_tensor *);

static const struct {
    const char *name;
    half_unary_fn fn;
} half_unary[] = {{"neg", tb_neg},
                  {"abs", tb_abs},
                  {"exp", tb_exp},
                  {"log", tb_log},
                  {"sqrt", tb_sqrt},
                  {"tanh", tb_tanh},
                  {"sigmoid", tb_sigmoid},
                  {"relu", tb_relu},
                  {"gelu", tb_gelu},
                  {"sin", tb_sin},
                  {"floor", tb_floor},
                  {"round", tb_round},
                  {"reciprocal", tb_reciprocal}};

static const struct {
    const char *name;
    half_binary_fn fn;
} half_binary[] = {{"add", tb_add}, {"sub", tb_sub},         {"mul", tb_mul},
                   {"div", tb_div}, {"maximum", tb_maximum}, {"pow", tb_pow}};

static tb_tensor *half_chain(tb_tensor *t) {
    tb_tensor *a = tb_add_scalar(tb_mul_scalar(t, 1.7), 0.3);
    return tb_mul(tb_tanh(tb_sub(tb_exp(a), t)), t);
}

/* The vector-set chain of half_torch.py's vchain: x, y of the row's dims, c one per row. */
static tb_tensor *half_vchain(tb_tensor **x) {
    tb_tensor *a = tb_add_scalar(tb_mul_scalar(x[0], 1.7), 0.3);
    tb_tensor *n1 = tb_div(tb_relu(tb_sub(tb_exp(a), x[1])), tb_add_scalar(tb_abs(x[0]), 1.0));
    tb_tensor *n2 = tb_mul(tb_sqrt(tb_abs(x[1])), x[2]);
    return tb_maximum(n1, tb_neg(n2));
}

/* vmixed: a 16-bit x widened, times an f32 tensor, plus one, cast back to x's dtype. */
static tb_tensor *half_vmixed(tb_tensor **x, tb_dtype dt) {
    return tb_cast(tb_add_scalar(tb_mul(tb_cast(x[0], TB_F32), x[1]), 1.0), dt);
}

static tb_tensor *half_apply(const half_case *c, tb_tensor **x) {
    size_t i;
    int32_t axis = atoi(c->arg);
    tb_dtype dt;
    for (i = 0; i < sizeof half_unary / sizeof half_unary[0]; i++)
        if (strcmp(c->op, half_unary[i].name) == 0) return half_unary[i].fn(x[0]);
    for (i = 0; i < sizeof half_binary / sizeof half_binary[0]; i++)
        if (strcmp(c->op, half_binary[i].name) == 0) return half_binary[i].fn(x[0], x[1]);
    if (strcmp(c->op, "add_scalar") == 0) return tb_add_scalar(x[0], atof(c->arg));
    if (strcmp(c->op, "mul_scalar") == 0) return tb_mul_scalar(x[0], atof(c->arg));
    if (strcmp(c->op, "sum") == 0)
        return tb_sum(x[0], axis < 0 ? NULL : &axis, axis < 0 ? 0 : 1, false);
    if (strcmp(c->op, "mean") == 0) return tb_mean(x[0], &axis, 1, false);
    if (strcmp(c->op, "max") == 0) return tb_max(x[0], &axis, 1, false);
    if (strcmp(c->op, "softmax") == 0) return tb_softmax(x[0], axis);
    if (strcmp(c->op, "log_softmax") == 0) return tb_log_softmax(x[0], axis);
    if (strcmp(c->op, "matmul") == 0) return tb_matmul(x[0], x[1]);
    if (strcmp(c->op, "chain") == 0) return half_chain(x[0]);
    if (strcmp(c->op, "vchain") == 0) return half_vchain(x);
    if (strcmp(c->op, "vmixed") == 0 && tb_dtype_parse(c->arg, &dt) == TB_OK)
        return half_vmixed(x, dt);
    if (strcmp(c->op, "cast") == 0 && tb_dtype_parse(c->arg, &dt) == TB_OK)
        return tb_cast(x[0], dt);
    return NULL;
}

/* Monotone integer of a float's bits, `sign` its sign bit (NaN excluded by the caller). */
static int64_t half_key(uint32_t bits, uint32_t sign) {
    return (bits & sign) ? -(int64_t)(bits & (sign - 1)) : (int64_t)bits;
}

static bool half_is_nan(tb_dtype dt, uint16_t h) {
    return dt == TB_F16 ? (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0
                        : (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0;
}

static bool half_is_inf(tb_dtype dt, uint16_t h) {
    return (h & 0x7fffu) == (dt == TB_F16 ? 0x7c00u : 0x7f80u);
}

/* Element i of a 16-bit or f32 tensor's data as a double. */
static double half_value(tb_dtype dt, const void *data, int64_t i) {
    uint16_t h;
    float f;
    if (dt == TB_F32) {
        memcpy(&f, (const char *)data + i * 4, 4);
        return f;
    }
    memcpy(&h, (const char *)data + i * 2, 2);
    return dt == TB_F16 ? tb_f16_to_f32(h) : tb_bf16_to_f32(h);
}

/* Element i as its bits and value, "bcf9 (-0.0304)". */
static void half_format(tb_dtype dt, const void *data, int64_t i, char *buf, size_t cap) {
    size_t es = tb_dtype_size(dt);
    const char *p = (const char *)data + i * (int64_t)es;
    uint64_t u = 0;
    uint32_t w;
    uint16_t h;
    if (es == 2) {
        memcpy(&h, p, 2);
        u = h;
    } else if (es == 4) {
        memcpy(&w, p, 4);
        u = w;
    } else if (es == 8) {
        memcpy(&u, p, 8);
    } else {
        u = (unsigned char)*p;
    }
    if (dt == TB_F16 || dt == TB_BF16 || dt == TB_F32) {
        snprintf(buf, cap, "%0*llx (%.9g)", (int)(2 * es), (unsigned long long)u,
                 half_value(dt, data, i));
    } else {
        snprintf(buf, cap, "%llx", (unsigned long long)u);
    }
}

/* How far element i of got is from want, in units in the last place of dt (16-bit floats and
   f32): 0 for the same bits or two NaNs, one unit between zeros of opposite signs, HUGE_VAL
   where a NaN or an infinity meets anything else, and for other dtypes where the bits
   differ. */
static double half_ulps(tb_dtype dt, const void *got, const void *want, int64_t i) {
    if (dt == TB_F16 || dt == TB_BF16) {
        uint16_t a, b;
        int64_t d;
        memcpy(&a, (const char *)got + i * 2, 2);
        memcpy(&b, (const char *)want + i * 2, 2);
        if (half_is_nan(dt, a) || half_is_nan(dt, b))
            return half_is_nan(dt, a) && half_is_nan(dt, b) ? 0.0 : HUGE_VAL;
        if (half_is_inf(dt, a) || half_is_inf(dt, b)) return a == b ? 0.0 : HUGE_VAL;
        d = half_key(a, 0x8000u) - half_key(b, 0x8000u);
        return d != 0 ? fabs((double)d) : a != b;
    }
    if (dt == TB_F32) {
        uint32_t a, b;
        float fa, fb;
        int64_t d;
        memcpy(&a, (const char *)got + i * 4, 4);
        memcpy(&b, (const char *)want + i * 4, 4);
        memcpy(&fa, &a, 4);
        memcpy(&fb, &b, 4);
        if (fa != fa || fb != fb) return fa != fa && fb != fb ? 0.0 : HUGE_VAL;
        if (isinf(fa) || isinf(fb)) return a == b ? 0.0 : HUGE_VAL;
        d = half_key(a, 0x80000000u) - half_key(b, 0x80000000u);
        return d != 0 ? fabs((double)d) : a != b;
    }
    return memcmp((const char *)got + i * (int64_t)tb_dtype_size(dt),
                  (const char *)want + i * (int64_t)tb_dtype_size(dt), tb_dtype_size(dt)) == 0
               ? 0.0
               : HUGE_VAL;
}

/* Element i of got and want within `ulps` units in the last place (half_ulps); `why` gets
   both. */
static bool half_close(tb_dtype dt, const void *got, const void *want, int64_t i, int ulps,
                       char *why, size_t cap) {
    char a[48], b[48];
    half_format(dt, got, i, a, sizeof a);
    half_format(dt, want, i, b, sizeof b);
    snprintf(why, cap, "element %lld: %s against %s", (long long)i, a, b);
    return half_ulps(dt, got, want, i) <= ulps;
}

/* The unit in the last place of a 16-bit tensor's largest finite |value| (the output's
   scale); the smallest subnormal where it has none but zeros. */
static double half_scale_unit(const half_tensor *t) {
    tb_dtype dt = t->shape.dtype;
    int emin = dt == TB_F16 ? -14 : -126, digits = dt == TB_F16 ? 10 : 7, e;
    double m = 0.0;
    int64_t n = 0, i;
    tb_shape_numel(&t->shape, &n);
    for (i = 0; i < n; i++) {
        double v = fabs(half_value(dt, t->data, i));
        if (isfinite(v) && v > m) m = v;
    }
    e = m > 0.0 ? ilogb(m) : emin;
    return ldexp(1.0, (e < emin ? emin : e) - digits);
}

/* How far element i of got is from native, in units of `unit`: NaN from NaN none; HUGE_VAL
   where a NaN or an infinity meets anything else. */
static double half_units_apart(tb_dtype dt, const void *got, const void *native, int64_t i,
                               double unit) {
    double a = half_value(dt, got, i), b = half_value(dt, native, i);
    if (a != a || b != b) return a != a && b != b ? 0.0 : HUGE_VAL;
    if (isinf(a) || isinf(b)) return a == b ? 0.0 : HUGE_VAL;
    return fabs(a - b) / unit;
}

/* Compares a device's result for case c with the case's reference and PyTorch's own kernel's
   result, printing what fails (and with TB_HALF_VERBOSE=1 the largest differences). */
static bool half_check_case(const half_case *c, const void *got, const char *device) {
    tb_dtype dt = c->out.shape.dtype;
    int64_t n = 0, i, bad = -1, bad_native = -1;
    double worst = 0.0, worst_native = 0.0, unit = 0.0;
    const char *verbose = getenv("TB_HALF_VERBOSE");
    char why[160];
    tb_shape_numel(&c->out.shape, &n);
    if (c->native.data != NULL) unit = half_scale_unit(&c->out);
    for (i = 0; i < n; i++) {
        double d = half_ulps(dt, got, c->out.data, i);
        if (d > worst) worst = d;
        if (d > c->ulps && bad < 0) bad = i;
        if (c->native.data != NULL) {
            d = half_units_apart(dt, got, c->native.data, i, unit);
            if (d > worst_native) worst_native = d;
            if (d > c->native_ulps && bad_native < 0) bad_native = i;
        }
    }
    if (bad >= 0) {
        half_close(dt, got, c->out.data, bad, c->ulps, why, sizeof why);
        print_message("%s on %s: %s, the reference (%g units in the last place, %d allowed; "
                      "the largest difference %g)\n",
                      c->name, device, why, half_ulps(dt, got, c->out.data, bad), c->ulps, worst);
    }
    if (bad_native >= 0) {
        half_close(dt, got, c->native.data, bad_native, 0, why, sizeof why);
        print_message("%s on %s: %s, PyTorch's own 16-bit kernel (%.3g units of %g, the "
                      "output's scale, %d allowed; the largest difference %.3g)\n",
                      c->name, device, why,
                      half_units_apart(dt, got, c->native.data, bad_native, unit), unit,
                      c->native_ulps, worst_native);
    }
    if (verbose != NULL && strcmp(verbose, "1") == 0) {
        if (c->native.data != NULL) {
            print_message("%-24s %-8s %g units (%d allowed), PyTorch's kernel %.3g units at "
                          "the output's scale (%d allowed)\n",
                          c->name, device, worst, c->ulps, worst_native, c->native_ulps);
        } else {
            print_message("%-24s %-8s %g units (%d allowed)\n", c->name, device, worst, c->ulps);
        }
    }
    return bad < 0 && bad_native < 0;
}

/* Runs every case on the device, returning how many failed (each printed). With `got_out`,
   the results are also kept (malloc'd, one per case) for comparing devices. */
static int half_run_cases(const tb_device *device, void ***got_out) {
    int failures = 0;
    size_t ci;
    void **kept = got_out ? (void **)calloc(g_half.num_cases, sizeof(void *)) : NULL;
    char name[64];
    tb_device_format(device, name, sizeof name);
    for (ci = 0; ci < g_half.num_cases; ci++) {
        const half_case *c = &g_half.cases[ci];
        tb_tensor *x[HALF_MAX_IN] = {NULL, NULL, NULL}, *y;
        tb_shape ys;
        void *got;
        int k;
        bool ok = true;
        for (k = 0; k < c->num_in; k++)
            x[k] = tb_tensor_from_host(c->in[k].data, &c->in[k].shape, device);
        tb_scope_begin(); /* the intermediates of a chain go with the scope */
        y = tb_scope_keep(half_apply(c, x));
        tb_scope_end();
        got = calloc(c->out.nbytes + 8, 1);
        ys = y ? tb_tensor_shape(y) : c->out.shape;
        if (y == NULL || !tb_shape_equal(&ys, &c->out.shape) ||
            tb_tensor_to_host(y, got, c->out.nbytes) != TB_OK) {
            char s1[96], s2[96];
            tb_shape_format(&ys, s1, sizeof s1);
            tb_shape_format(&c->out.shape, s2, sizeof s2);
            print_message("%s on %s: %s (shape %s, PyTorch %s)\n", c->name, name, tb_last_error(),
                          s1, s2);
            ok = false;
        } else {
            ok = half_check_case(c, got, name);
        }
        if (!ok) failures++;
        if (kept) {
            kept[ci] = got;
        } else {
            free(got);
        }
        tb_tensor_release(y);
        for (k = 0; k < c->num_in; k++)
            tb_tensor_release(x[k]);
    }
    if (got_out) *got_out = kept;
    return failures;
}

/* Every 16-bit pattern cast to f32 on the device, and the oracle's f32 values cast to 16 bits,
   against the library's host conversions (which the exhaustive test holds to PyTorch's):
   returns how many differ (NaN only has to stay NaN). */
static int half_device_conversions(const tb_device *device) {
    int k, bad = 0;
    static uint16_t pats[65536];
    static float f32[65536];
    for (k = 0; k < 2; k++) {
        tb_dtype dt = k == 0 ? TB_F16 : TB_BF16;
        tb_shape s = tb_shape_of(dt, 1, 65536), sf;
        tb_tensor *x, *y, *z, *w;
        size_t i, n = g_half.f2h_count[k];
        uint16_t *back = (uint16_t *)calloc(n + 1, 2);
        for (i = 0; i < 65536; i++)
            pats[i] = (uint16_t)i;
        x = tb_tensor_from_host(pats, &s, device);
        y = tb_cast(x, TB_F32);
        if (back == NULL || tb_tensor_to_host(y, f32, sizeof f32) != TB_OK) {
            print_message("%s\n", tb_last_error());
            bad++;
        }
        for (i = 0; i < 65536 && bad < 5; i++) {
            float want = k == 0 ? tb_f16_to_f32(pats[i]) : tb_bf16_to_f32(pats[i]);
            if (want != want ? f32[i] == f32[i] : memcmp(&want, &f32[i], 4) != 0) {
                print_message("%s %04x to f32 on the device: %.9g, expected %.9g\n",
                              tb_dtype_name(dt), (unsigned)i, f32[i], want);
                bad++;
            }
        }
        tb_shape_make(&sf, TB_F32, 1, (const int64_t[]){(int64_t)n});
        z = tb_tensor_from_host(g_half.f2h_in[k], &sf, device);
        w = tb_cast(z, dt);
        if (back == NULL || tb_tensor_to_host(w, back, n * 2) != TB_OK) {
            print_message("%s\n", tb_last_error());
            bad++;
        }
        for (i = 0; i < n && back != NULL && bad < 10; i++) {
            float f;
            uint16_t want;
            memcpy(&f, &g_half.f2h_in[k][i], 4);
            want = k == 0 ? tb_f32_to_f16(f) : tb_f32_to_bf16(f);
            if (f != f ? !half_is_nan(dt, back[i]) : back[i] != want) {
                print_message("f32 %08x to %s on the device: %04x, expected %04x\n",
                              (unsigned)g_half.f2h_in[k][i], tb_dtype_name(dt), back[i], want);
                bad++;
            }
        }
        free(back);
        tb_tensor_release(w);
        tb_tensor_release(z);
        tb_tensor_release(y);
        tb_tensor_release(x);
    }
    return bad;
}
