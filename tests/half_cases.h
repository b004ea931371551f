/* The f16 and bf16 cases of tests/half_torch.py (PyTorch's conversions and op results), read
   once and run on a device: shared by tests/test_half.c and tests/test_half_opencl.c. The
   including file defines TB_IMPLEMENTATION and includes cmocka and the header first. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
    half_tensor out;
} half_case;

typedef struct half_oracle {
    bool loaded;
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

/* "in f16 2 3 4 HEX..." into t; false on a malformed line. */
static bool half_parse_tensor(char *line, half_tensor *t) {
    char *save = NULL, *tok = strtok_r(line, " \n", &save);
    int64_t dims[TB_MAX_RANK], n = 1, i;
    int32_t rank, d;
    tb_dtype dt;
    size_t es;
    tok = strtok_r(NULL, " \n", &save);
    if (tok == NULL || tb_dtype_parse(tok, &dt) != TB_OK) return false;
    tok = strtok_r(NULL, " \n", &save);
    if (tok == NULL) return false;
    rank = atoi(tok);
    for (d = 0; d < rank; d++) {
        tok = strtok_r(NULL, " \n", &save);
        if (tok == NULL) return false;
        dims[d] = atoll(tok);
        n *= dims[d];
    }
    if (tb_shape_make(&t->shape, dt, rank, dims) != TB_OK) return false;
    es = tb_dtype_size(dt);
    t->nbytes = (size_t)n * es;
    t->data = calloc((size_t)n + 1, es);
    if (t->data == NULL) return false;
    for (i = 0; i < n; i++) {
        uint64_t u;
        tok = strtok_r(NULL, " \n", &save);
        if (tok == NULL) return false;
        u = strtoull(tok, NULL, 16);
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
    return true;
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

static bool half_read_line(half_oracle *o, char *line) {
    char a[16], b[16], c[16];
    int k;
    if (strncmp(line, "h2f ", 4) == 0 || strncmp(line, "f2h ", 4) == 0) {
        if (sscanf(line + 4, "%15s %15s %15s", a, b, c) != 3) return false;
        k = half_dtype_index(a);
        if (k < 0) return false;
        if (line[0] == 'h') {
            o->h2f[k][strtoul(b, NULL, 16) & 0xffffu] = (uint32_t)strtoul(c, NULL, 16);
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
        o->f2h_in[k][o->f2h_count[k]] = (uint32_t)strtoul(b, NULL, 16);
        o->f2h_out[k][o->f2h_count[k]++] = (uint16_t)strtoul(c, NULL, 16);
        return true;
    }
    if (strncmp(line, "case ", 5) == 0) {
        half_case *hc;
        if (!half_grow((void **)&o->cases, &o->cap_cases, o->num_cases + 1, sizeof *o->cases))
            return false;
        hc = &o->cases[o->num_cases++];
        memset(hc, 0, sizeof *hc);
        return sscanf(line + 5, "%63s %31s %31s", hc->name, hc->op, hc->arg) == 3;
    }
    if (o->num_cases == 0) return strncmp(line, "end", 3) == 0;
    if (strncmp(line, "in ", 3) == 0) {
        half_case *hc = &o->cases[o->num_cases - 1];
        if (hc->num_in >= HALF_MAX_IN) return false;
        return half_parse_tensor(line, &hc->in[hc->num_in++]);
    }
    if (strncmp(line, "out ", 4) == 0)
        return half_parse_tensor(line, &o->cases[o->num_cases - 1].out);
    return strncmp(line, "end", 3) == 0;
}

/* Runs the oracle once; g_half.why says why it is not loaded. */
static void half_load(void) {
    FILE *p;
    char *line = NULL;
    size_t cap = 0;
    bool ok = true;
    if (g_half.loaded || g_half.why[0] != '\0') return;
    if (access("/usr/bin/python3", X_OK) != 0) {
        snprintf(g_half.why, sizeof g_half.why, "no /usr/bin/python3");
        return;
    }
    p = popen("/usr/bin/python3 tests/half_torch.py 2>&1", "r");
    if (p == NULL) {
        snprintf(g_half.why, sizeof g_half.why, "popen failed");
        return;
    }
    while (getline(&line, &cap, p) > 0) {
        if (strncmp(line, "torch-unavailable", 17) == 0) {
            snprintf(g_half.why, sizeof g_half.why, "%.200s", line);
            ok = false;
            break;
        }
        if (ok && !half_read_line(&g_half, line)) {
            snprintf(g_half.why, sizeof g_half.why, "bad oracle line: %.120s", line);
            ok = false;
        }
    }
    free(line);
    if (pclose(p) != 0 && ok) {
        snprintf(g_half.why, sizeof g_half.why, "tests/half_torch.py failed");
        ok = false;
    }
    g_half.loaded = ok && g_half.num_cases > 0;
    if (ok && !g_half.loaded) snprintf(g_half.why, sizeof g_half.why, "the oracle gave no cases");
}

static void half_free(void) {
    size_t i;
    int k;
    for (i = 0; i < g_half.num_cases; i++) {
        for (k = 0; k < g_half.cases[i].num_in; k++)
            free(g_half.cases[i].in[k].data);
        free(g_half.cases[i].out.data);
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

/* Monotone integer of a 16-bit float's bits (NaN excluded by the caller). */
static int32_t half_key(uint16_t h) {
    return (h & 0x8000u) ? -(int32_t)(h & 0x7fffu) : (int32_t)h;
}

static bool half_is_nan(tb_dtype dt, uint16_t h) {
    return dt == TB_F16 ? (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0
                        : (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0;
}

static bool half_is_inf(tb_dtype dt, uint16_t h) {
    return (h & 0x7fffu) == (dt == TB_F16 ? 0x7c00u : 0x7f80u);
}

/* Element i of got and want agree: 16-bit floats within one unit in the last place (NaN with
   NaN, infinities exactly), f32 within one unit, integers exactly. */
static bool half_close(tb_dtype dt, const void *got, const void *want, int64_t i, char *why,
                       size_t cap) {
    if (dt == TB_F16 || dt == TB_BF16) {
        uint16_t a, b;
        memcpy(&a, (const char *)got + i * 2, 2);
        memcpy(&b, (const char *)want + i * 2, 2);
        snprintf(why, cap, "element %lld: %04x, PyTorch %04x", (long long)i, a, b);
        if (half_is_nan(dt, a) || half_is_nan(dt, b))
            return half_is_nan(dt, a) && half_is_nan(dt, b);
        if (half_is_inf(dt, a) || half_is_inf(dt, b)) return a == b;
        return abs(half_key(a) - half_key(b)) <= 1;
    }
    if (dt == TB_F32) {
        int32_t a, b;
        float fa, fb;
        memcpy(&a, (const char *)got + i * 4, 4);
        memcpy(&b, (const char *)want + i * 4, 4);
        memcpy(&fa, &a, 4);
        memcpy(&fb, &b, 4);
        snprintf(why, cap, "element %lld: %.9g, PyTorch %.9g", (long long)i, fa, fb);
        if (fa != fa || fb != fb) return fa != fa && fb != fb;
        if ((a < 0) != (b < 0)) return fa == fb; /* +0 and -0 */
        return llabs((long long)a - (long long)b) <= 1;
    }
    snprintf(why, cap, "element %lld differs", (long long)i);
    return memcmp((const char *)got + i * (int64_t)tb_dtype_size(dt),
                  (const char *)want + i * (int64_t)tb_dtype_size(dt), tb_dtype_size(dt)) == 0;
}

/* Runs every case on the device, returning how many failed (each printed). With `got_out`,
   the results are also kept (malloc'd, one per case) for comparing devices. */
static int half_run_cases(const tb_device *device, void ***got_out) {
    int failures = 0;
    size_t ci;
    void **kept = got_out ? (void **)calloc(g_half.num_cases, sizeof(void *)) : NULL;
    for (ci = 0; ci < g_half.num_cases; ci++) {
        const half_case *c = &g_half.cases[ci];
        tb_tensor *x[HALF_MAX_IN] = {NULL, NULL, NULL}, *y;
        tb_shape ys;
        void *got;
        int k;
        int64_t n, i;
        char why[160];
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
            print_message("%s: %s (shape %s, PyTorch %s)\n", c->name,
                          y ? tb_last_error() : tb_last_error(), s1, s2);
            ok = false;
        } else {
            tb_shape_numel(&c->out.shape, &n);
            for (i = 0; i < n && ok; i++) {
                if (!half_close(c->out.shape.dtype, got, c->out.data, i, why, sizeof why)) {
                    print_message("%s: %s\n", c->name, why);
                    ok = false;
                }
            }
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
