/* ===========================================================================================
   Index arithmetic for generated kernels: which element of an array a kernel is at, as affine
   forms over the kernel's index variables (c + sum(coef * var)). A position holds a flat
   (row-major) form, a form per dim, or both; a movement op maps the positions of its output
   to positions of its operand, so views never copy, and a reshape that no affine form can
   follow unravels its flat offset with division and remainder (only there). Positions are
   interned (equal positions share an id) and the lines that compute index variables are
   emitted once per block, into the kernel's text. Language-neutral: it writes `long`
   variables and C expressions, which OpenCL C and C99 share.
   =========================================================================================== */
#include "../impl_begin.h"

#if defined(TB__HAVE_COMPILED_BACKENDS)

static tb_status tb__ix_fail(tb__ix *g, tb_status st) {
    if (g->status == TB_OK) g->status = st;
    return st;
}

static void tb__ix_line(tb__ix *g, const char *fmt, ...) TB_PRINTF_LIKE(2, 3);
static void tb__ix_line(tb__ix *g, const char *fmt, ...) {
    char small[512];
    va_list ap;
    int n;
    va_start(ap, fmt);
    n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) {
        g->body.failed = true; /* a line left out is a wrong kernel: fail the whole body */
        return;
    }
    tb__str_append(&g->body, "%*s", g->indent * 4, "");
    if ((size_t)n < sizeof small) {
        tb__str_append(&g->body, "%s\n", small);
    } else {
        char *big = (char *)tb__alloc((size_t)n + 1);
        if (big == NULL) {
            g->body.failed = true;
            return;
        }
        va_start(ap, fmt);
        vsnprintf(big, (size_t)n + 1, fmt, ap);
        va_end(ap);
        tb__str_append(&g->body, "%s\n", big);
        tb__free(big);
    }
}

static int64_t tb__sat_add(int64_t a, int64_t b) {
    if (b > 0 && a > INT64_MAX - b) return INT64_MAX;
    if (b < 0 && a < INT64_MIN - b) return INT64_MIN;
    return a + b;
}

static int64_t tb__sat_mul(int64_t a, int64_t b) {
    if (a == 0 || b == 0) return 0;
    if (a > 0 ? (b > 0 ? a > INT64_MAX / b : b < INT64_MIN / a)
              : (b > 0 ? a < INT64_MIN / b : a < INT64_MAX / b))
        return ((a > 0) == (b > 0)) ? INT64_MAX : INT64_MIN;
    return a * b;
}

/* The least q with q * k >= a (k > 0). */
static int64_t tb__ix_ceil_div(int64_t a, int64_t k) {
    return a >= 0 ? (a + k - 1) / k : -((-a) / k);
}

static int32_t tb__ix_new_var(tb__ix *g, int64_t lo, int64_t hi) {
    if (tb__grow((void **)&g->vars, &g->cap_vars, g->num_vars + 1, sizeof(tb__ix_var)) != TB_OK) {
        tb__ix_fail(g, TB_ERR_OUT_OF_MEMORY);
        return -1;
    }
    g->vars[g->num_vars].lo = lo;
    g->vars[g->num_vars].hi = hi;
    g->vars[g->num_vars].traced = 0;
    g->vars[g->num_vars].def = TB__IX_ROOT;
    return (int32_t)g->num_vars++;
}

/* A new variable that is digit (src / q) % d of variable src (d 0: src / q); its line is the
   caller's. */
static int32_t tb__ix_new_digit(tb__ix *g, int64_t lo, int64_t hi, int32_t src, int64_t q,
                                int64_t d) {
    int32_t v = tb__ix_new_var(g, lo, hi);
    if (v >= 0) {
        g->vars[v].def = TB__IX_DIGIT;
        g->vars[v].src = src;
        g->vars[v].q = q;
        g->vars[v].d = d;
    }
    return v;
}

static bool tb__ix_value(const tb__ix *g, int32_t var, int32_t root, int64_t value, int64_t *out) {
    const tb__ix_var *v;
    int64_t x;
    int32_t i;
    if (var == root) {
        *out = value;
        return true;
    }
    if (var < root) return false; /* declared before root: not computed from it */
    v = &g->vars[var];
    if (v->def == TB__IX_DIGIT) {
        if (!tb__ix_value(g, v->src, root, value, &x) || v->q < 1) return false;
        *out = v->d > 0 ? (x / v->q) % v->d : x / v->q;
        return true;
    }
    if (v->def != TB__IX_FORM) return false;
    *out = v->form.c;
    for (i = 0; i < v->form.n; i++) {
        if (!tb__ix_value(g, v->form.var[i], root, value, &x)) return false;
        *out += v->form.coef[i] * x;
    }
    return true;
}

static bool tb__ix_form_text(const tb__ix *ix, const tb__lf *f, int32_t first, int32_t row,
                             tb__str *out) {
    int32_t j;
    bool alone = f->n == 1 && f->coef[0] == 1 && f->c == 0;
    if (!alone) tb__str_append(out, "(");
    for (j = 0; j < f->n; j++) {
        const tb__ix_var *x = &ix->vars[f->var[j]];
        if (f->var[j] == row) return false;
        if (j > 0) tb__str_append(out, " + ");
        if (f->coef[j] != 1) tb__str_append(out, "%lldL * ", (long long)f->coef[j]);
        if (f->var[j] < first) {
            tb__str_append(out, "i%d", (int)f->var[j]);
        } else if (x->def == TB__IX_DIGIT && x->q >= 1) {
            tb__lf src;
            tb__lf_const(&src, 0);
            tb__lf_add_term(&src, x->src, 1);
            tb__str_append(out, "(");
            if (!tb__ix_form_text(ix, &src, first, row, out)) return false;
            if (x->q > 1) tb__str_append(out, " / %lldL", (long long)x->q);
            if (x->d > 0) tb__str_append(out, " %% %lldL", (long long)x->d);
            tb__str_append(out, ")");
        } else if (x->def != TB__IX_FORM || !tb__ix_form_text(ix, &x->form, first, row, out)) {
            return false;
        }
    }
    if (f->c != 0 || f->n == 0)
        tb__str_append(out, "%s%lldL", f->n > 0 ? " + " : "", (long long)f->c);
    if (!alone) tb__str_append(out, ")");
    return !out->failed;
}

/* Notes that a line divides (or reduces) variable `src` with the given period: the number of
   consecutive values of src over which the result changes by steps of 0 or 1 only. */
static void tb__ix_note_period(tb__ix *g, int32_t src, int64_t period) {
    if (!g->vars[src].traced || period <= 1) return;
    if (g->period == 0 || period < g->period) g->period = period;
}

static void tb__lf_const(tb__lf *lf, int64_t c) {
    memset(lf, 0, sizeof *lf);
    lf->c = c;
}

static bool tb__lf_add_term(tb__lf *lf, int32_t var, int64_t coef) {
    int32_t i, j;
    if (coef == 0) return true;
    for (i = 0; i < lf->n; i++) {
        if (lf->var[i] == var) {
            lf->coef[i] += coef;
            if (lf->coef[i] == 0) {
                for (j = i; j + 1 < lf->n; j++) {
                    lf->var[j] = lf->var[j + 1];
                    lf->coef[j] = lf->coef[j + 1];
                }
                lf->n--;
                lf->var[lf->n] = 0;
                lf->coef[lf->n] = 0;
            }
            return true;
        }
        if (lf->var[i] > var) break;
    }
    if (lf->n == TB__LF_MAX) return false;
    for (j = lf->n; j > i; j--) {
        lf->var[j] = lf->var[j - 1];
        lf->coef[j] = lf->coef[j - 1];
    }
    lf->var[i] = var;
    lf->coef[i] = coef;
    lf->n++;
    return true;
}

static void tb__ix_lf_range(const tb__ix *g, const tb__lf *lf, int64_t *lo, int64_t *hi) {
    int32_t i;
    *lo = lf->c;
    *hi = lf->c;
    for (i = 0; i < lf->n; i++) {
        int64_t a = tb__sat_mul(lf->coef[i], g->vars[lf->var[i]].lo);
        int64_t b = tb__sat_mul(lf->coef[i], g->vars[lf->var[i]].hi);
        *lo = tb__sat_add(*lo, a < b ? a : b);
        *hi = tb__sat_add(*hi, a < b ? b : a);
    }
}

/* The coefficient of variable v in form f (0: none, or v < 0). */
static int64_t tb__lf_coef(const tb__lf *f, int32_t v) {
    int32_t j;
    for (j = 0; v >= 0 && j < f->n; j++)
        if (f->var[j] == v) return f->coef[j];
    return 0;
}

/* The form as OpenCL C (a long expression). */
static void tb__lf_text(const tb__lf *lf, char *buf, size_t cap) {
    size_t len = 0;
    int32_t i;
    buf[0] = '\0';
    for (i = 0; i < lf->n; i++) {
        int64_t c = lf->coef[i];
        const char *sign = (c < 0) ? (len == 0 ? "-" : " - ") : (len == 0 ? "" : " + ");
        uint64_t mag = c < 0 ? (uint64_t)0 - (uint64_t)c : (uint64_t)c;
        int n;
        if (mag == 1) {
            n = snprintf(buf + len, cap - len, "%si%d", sign, (int)lf->var[i]);
        } else {
            n = snprintf(buf + len, cap - len, "%si%d * %llu%s", sign, (int)lf->var[i],
                         (unsigned long long)mag, mag > 2147483647u ? "L" : "");
        }
        if (n < 0 || (size_t)n >= cap - len) return;
        len += (size_t)n;
    }
    if (lf->c != 0 || len == 0) {
        uint64_t mag = lf->c < 0 ? (uint64_t)0 - (uint64_t)lf->c : (uint64_t)lf->c;
        const char *sign = lf->c < 0 ? (len == 0 ? "-" : " - ") : (len == 0 ? "" : " + ");
        snprintf(buf + len, cap - len, "%s%llu%s", sign, (unsigned long long)mag,
                 mag > 2147483647u ? "L" : "");
    }
}

/* Buffer bN's element at flat index `f` as the address of the terms that do not change along
   the loop of variable `inner` indexed by the rest, as C text in `buf`: `(bN + (R))[V]`. Only
   where `inner` has a term and both parts are never negative (the address then stays inside
   the buffer wherever the read does); false otherwise. PoCL's compiler vectorises a pack's copy
   of a strided run in that form, not as one sum (ResNet's first convolution, trained, its
   windows at stride 2 packed by the matmul's items: 10.1 -> 7.0 ms); C compilers take
   either. */
static bool tb__ix_split_text(const tb__ix *g, const tb__lf *f, int32_t inner, int slot, char *buf,
                              size_t cap) {
    char rt[TB__LF_TEXT], vt[TB__LF_TEXT];
    tb__lf r, v;
    int64_t lo, hi;
    int32_t i;
    if (tb__lf_coef(f, inner) == 0) return false; /* no term of the loop's (or no loop) */
    tb__lf_const(&r, 0);
    tb__lf_const(&v, f->c);
    for (i = 0; i < f->n; i++)
        if (!tb__lf_add_term(f->var[i] == inner || f->coef[i] < 0 ? &v : &r, f->var[i], f->coef[i]))
            return false;
    if (r.n == 0) return false;
    tb__ix_lf_range(g, &r, &lo, &hi);
    if (lo < 0) return false;
    tb__ix_lf_range(g, &v, &lo, &hi);
    if (lo < 0) return false;
    tb__lf_text(&r, rt, sizeof rt);
    tb__lf_text(&v, vt, sizeof vt);
    return snprintf(buf, cap, "(b%d + (%s))[%s]", slot, rt, vt) < (int)cap;
}

/* A new variable holding form lf's value, with range [lo, hi]; its line is written here. */
static int32_t tb__ix_form_var(tb__ix *g, const tb__lf *lf, int64_t lo, int64_t hi) {
    char text[TB__LF_TEXT];
    int32_t v = tb__ix_new_var(g, lo, hi), i;
    if (v < 0) return -1;
    g->vars[v].def = TB__IX_FORM;
    g->vars[v].form = *lf;
    for (i = 0; i < lf->n; i++)
        g->vars[v].traced |= g->vars[lf->var[i]].traced;
    tb__lf_text(lf, text, sizeof text);
    tb__ix_line(g, "const long i%d = %s;", (int)v, text);
    return v;
}

/* A new variable holding the form's value. */
static int32_t tb__ix_spill(tb__ix *g, const tb__lf *lf) {
    int64_t lo, hi;
    if (lf->n == 1 && lf->c == 0 && lf->coef[0] == 1) return lf->var[0];
    tb__ix_lf_range(g, lf, &lo, &hi);
    return tb__ix_form_var(g, lf, lo, hi);
}

/* Inside a test that form `f` (one variable plus a constant) lies in [lo, hi]: its variable
   becomes a copy with the range that gives it (tb__ix_form_var), so that the index
   arithmetic under the test knows it (a flat offset of a padded axis then splits back into
   dims without a division). Forms of other shapes, and ranges no narrower (or empty: the test
   never holds), stay as they are. 0, or -1 on failure. */
static int32_t tb__ix_narrow_axis(tb__ix *ix, tb__lf *f, int64_t lo, int64_t hi) {
    int32_t var = f->var[0];
    tb__lf copy;
    if (f->n != 1 || f->coef[0] != 1) return 0;
    lo = lo - f->c > ix->vars[var].lo ? lo - f->c : ix->vars[var].lo;
    hi = hi - f->c < ix->vars[var].hi ? hi - f->c : ix->vars[var].hi;
    if (lo > hi || (lo == ix->vars[var].lo && hi == ix->vars[var].hi)) return 0;
    tb__lf_const(&copy, 0);
    tb__lf_add_term(&copy, var, 1);
    f->var[0] = tb__ix_form_var(ix, &copy, lo, hi);
    return f->var[0] < 0 ? -1 : 0;
}

/* dst += scale * src, spilling into variables when the terms do not fit. */
static bool tb__ix_lf_addmul(tb__ix *g, tb__lf *dst, const tb__lf *src, int64_t scale) {
    int32_t i;
    tb__lf s = *src;
    if (scale == 0) return true;
    dst->c += s.c * scale;
    for (i = 0; i < s.n; i++) {
        if (!tb__lf_add_term(dst, s.var[i], s.coef[i] * scale)) {
            int32_t v = tb__ix_spill(g, dst);
            if (v < 0) return false;
            tb__lf_const(dst, 0);
            tb__lf_add_term(dst, v, 1);
            tb__lf_add_term(dst, s.var[i], s.coef[i] * scale);
        }
    }
    return true;
}

static void tb__ix_contig(int32_t rank, const int64_t *dims, int64_t *strides) {
    int64_t s = 1;
    int32_t i;
    for (i = rank - 1; i >= 0; i--) {
        strides[i] = s;
        s *= dims[i] > 0 ? dims[i] : 1;
    }
}

static void tb__ix_pos_init(tb__pos *p, const tb_shape *shape) {
    memset(p, 0, sizeof *p);
    p->rank = shape->rank;
    memcpy(p->dims, shape->dims, (size_t)shape->rank * sizeof(int64_t));
}

static uint64_t tb__ix_pos_hash(const tb__pos *p) {
    uint64_t h = tb__hash_u64(0x706f736974696f6eull, (uint64_t)(uint32_t)p->rank);
    h = tb__hash_bytes(h, p->dims, sizeof p->dims);
    h = tb__hash_u64(h, (uint64_t)p->key_flat);
    if (p->key_flat) return tb__hash_bytes(h, &p->flat, sizeof p->flat);
    return tb__hash_bytes(h, p->dim, sizeof p->dim);
}

static bool tb__ix_pos_same(const tb__pos *a, const tb__pos *b) {
    if (a->rank != b->rank || a->key_flat != b->key_flat) return false;
    if (memcmp(a->dims, b->dims, sizeof a->dims) != 0) return false;
    if (a->key_flat) return memcmp(&a->flat, &b->flat, sizeof a->flat) == 0;
    return memcmp(a->dim, b->dim, sizeof a->dim) == 0;
}

/* Canonical form (dims of size 1 are at index 0; arrays of 0 or 1 element at offset 0), then
   the id of the equal interned position. */
static int32_t tb__ix_intern(tb__ix *g, tb__pos *p) {
    int64_t numel = 1;
    int32_t i, id;
    size_t b;
    for (i = 0; i < p->rank; i++)
        numel *= p->dims[i];
    if (numel <= 1) {
        tb__lf_const(&p->flat, 0);
        for (i = 0; i < p->rank; i++)
            tb__lf_const(&p->dim[i], 0);
        p->has_flat = p->has_multi = 1;
        p->key_flat = 1;
    } else {
        if (p->has_multi) {
            for (i = 0; i < p->rank; i++)
                if (p->dims[i] == 1) tb__lf_const(&p->dim[i], 0);
        }
        p->key_flat = p->has_flat ? 1 : 0;
    }
    if (!p->has_flat) tb__lf_const(&p->flat, 0);
    if (!p->has_multi) {
        for (i = 0; i < TB_MAX_RANK; i++)
            tb__lf_const(&p->dim[i], 0);
    }
    for (i = p->rank; i < TB_MAX_RANK; i++) {
        p->dims[i] = 0;
        tb__lf_const(&p->dim[i], 0);
    }
    p->hash = tb__ix_pos_hash(p);
    b = (size_t)(p->hash & (TB__IX_BUCKETS - 1));
    for (id = g->pos_head[b]; id >= 0; id = g->pos[id].next) {
        if (g->pos[id].hash == p->hash && tb__ix_pos_same(&g->pos[id], p)) return id;
    }
    if (tb__grow((void **)&g->pos, &g->cap_pos, g->num_pos + 1, sizeof(tb__pos)) != TB_OK) {
        tb__ix_fail(g, TB_ERR_OUT_OF_MEMORY);
        return -1;
    }
    id = (int32_t)g->num_pos++;
    g->pos[id] = *p;
    g->pos[id].next = g->pos_head[b];
    g->pos_head[b] = id;
    return id;
}

static uint64_t tb__ix_memo_key(int32_t kind, int32_t a, int32_t b, uint64_t extra) {
    uint64_t h = tb__hash_u64(0x6d656d6f00000001ull, (uint64_t)(uint32_t)kind);
    h = tb__hash_u64(h, (uint64_t)(uint32_t)a);
    h = tb__hash_u64(h, (uint64_t)(uint32_t)b);
    return tb__hash_u64(h, extra);
}

static int32_t tb__ix_memo_find(const tb__ix *g, int32_t kind, int32_t a, int32_t b,
                                uint64_t extra) {
    uint64_t key = tb__ix_memo_key(kind, a, b, extra);
    int32_t e;
    for (e = g->memo_head[key & (TB__IX_BUCKETS - 1)]; e >= 0; e = g->memo[e].next) {
        const tb__ix_memo *m = &g->memo[e];
        if (m->key == key && m->kind == kind && m->a == a && m->b == b && m->extra == extra)
            return m->value;
    }
    return -1;
}

static void tb__ix_memo_add(tb__ix *g, int32_t kind, int32_t a, int32_t b, uint64_t extra,
                            int32_t value) {
    uint64_t key = tb__ix_memo_key(kind, a, b, extra);
    size_t bucket = (size_t)(key & (TB__IX_BUCKETS - 1));
    tb__ix_memo *m;
    if (tb__grow((void **)&g->memo, &g->cap_memo, g->num_memo + 1, sizeof(tb__ix_memo)) != TB_OK) {
        tb__ix_fail(g, TB_ERR_OUT_OF_MEMORY);
        return;
    }
    m = &g->memo[g->num_memo];
    m->key = key;
    m->kind = kind;
    m->a = a;
    m->b = b;
    m->extra = extra;
    m->value = value;
    m->next = g->memo_head[bucket];
    g->memo_head[bucket] = (int32_t)g->num_memo++;
}

static void tb__ix_undo_push(tb__ix *g, int32_t pos, int32_t form) {
    if (g->num_scopes == 0) return; /* the kernel's outermost scope never closes */
    if (tb__grow((void **)&g->undo, &g->cap_undo, g->num_undo + 1, sizeof(tb__ix_undo)) != TB_OK) {
        tb__ix_fail(g, TB_ERR_OUT_OF_MEMORY);
        return;
    }
    g->undo[g->num_undo].pos = pos;
    g->undo[g->num_undo].form = form;
    g->num_undo++;
}

/* `{` with a memo scope: values and variables made inside are forgotten at the `}`. */
static void tb__ix_open(tb__ix *g, const char *head) {
    if (tb__grow((void **)&g->scopes, &g->cap_scopes, g->num_scopes + 1, sizeof(tb__ix_scope)) !=
        TB_OK) {
        tb__ix_fail(g, TB_ERR_OUT_OF_MEMORY);
        return;
    }
    g->scopes[g->num_scopes].memo = g->num_memo;
    g->scopes[g->num_scopes].undo = g->num_undo;
    g->num_scopes++;
    tb__ix_line(g, "%s{", head);
    g->indent++;
}

/* Drops the text emitted since `mark` (an earlier body length): what a trial emission wrote to
   learn something of the index (a period, a buffer's flat index) leaves no line behind. */
static void tb__ix_drop(tb__ix *g, size_t mark) {
    if (g->body.failed || g->body.data == NULL || mark > g->body.len) return;
    g->body.len = mark;
    g->body.data[mark] = '\0';
}

static void tb__ix_close(tb__ix *g, const char *tail) {
    tb__ix_scope sc;
    if (g->num_scopes == 0) return;
    sc = g->scopes[--g->num_scopes];
    while (g->num_memo > sc.memo) {
        tb__ix_memo *m = &g->memo[--g->num_memo];
        g->memo_head[m->key & (TB__IX_BUCKETS - 1)] = m->next;
    }
    while (g->num_undo > sc.undo) {
        tb__ix_undo *u = &g->undo[--g->num_undo];
        if (u->form == 1) {
            g->pos[u->pos].has_flat = 0;
            tb__lf_const(&g->pos[u->pos].flat, 0);
        } else {
            int32_t i;
            g->pos[u->pos].has_multi = 0;
            for (i = 0; i < TB_MAX_RANK; i++)
                tb__lf_const(&g->pos[u->pos].dim[i], 0);
        }
    }
    g->indent--;
    tb__ix_line(g, "}%s", tail);
}

/* Makes sure the position has its flat form (sum of dim * contiguous stride). False for the
   -1 of a position that could not be made (code generation stopped). */
static bool tb__ix_need_flat(tb__ix *g, int32_t id) {
    int64_t strides[TB_MAX_RANK];
    tb__lf flat;
    tb__pos p;
    int32_t i;
    if (id < 0 || g->status != TB_OK) return false;
    if (g->pos[id].has_flat) return true;
    p = g->pos[id];
    tb__ix_contig(p.rank, p.dims, strides);
    tb__lf_const(&flat, 0);
    for (i = 0; i < p.rank; i++) {
        if (!tb__ix_lf_addmul(g, &flat, &p.dim[i], strides[i])) return false;
    }
    g->pos[id].flat = flat;
    g->pos[id].has_flat = 1;
    tb__ix_undo_push(g, id, 1);
    return g->status == TB_OK;
}

/* Splits a flat form into per-dim affine forms when no term carries across a digit (merged
   or contiguous dims); false when it cannot. The constant goes by digits from the innermost dim
   out, each digit the one value congruent to what is left that keeps its dim's form inside the
   dim (a row read at column i - 1 for i >= 1 keeps its - 1 there); the outermost dim takes the
   rest. */
static bool tb__ix_affine_split(const tb__ix *g, const tb__lf *flat, int32_t rank,
                                const int64_t *dims, tb__lf *out) {
    int64_t strides[TB_MAX_RANK], rest = flat->c, lo, hi;
    int32_t i, j, outer = -1;
    tb__ix_contig(rank, dims, strides);
    for (j = 0; j < rank; j++) {
        if (dims[j] < 1) return false; /* no element */
        tb__lf_const(&out[j], 0);
        if (outer < 0 && dims[j] > 1) outer = j;
    }
    for (i = 0; i < flat->n; i++) {
        int64_t f = flat->coef[i];
        for (j = 0; j < rank; j++) {
            if (dims[j] > 1 && f % strides[j] == 0) break;
        }
        if (j == rank) return false;
        if (!tb__lf_add_term(&out[j], flat->var[i], f / strides[j])) return false;
    }
    for (j = rank - 1; j >= 0; j--) {
        int64_t d = dims[j], m, c;
        if (d <= 1) continue;
        tb__ix_lf_range(g, &out[j], &lo, &hi);
        if (lo < -((int64_t)1 << 52) || hi > ((int64_t)1 << 52)) return false;
        if (j == outer) {
            c = rest;
        } else {
            m = (rest % d + d) % d;
            c = m + tb__ix_ceil_div(-lo - m, d) * d; /* the least c = m (mod d), c + lo >= 0 */
            rest = (rest - c) / d;
        }
        if (c + lo < 0 || c + hi >= d) return false;
        out[j].c = c;
    }
    return outer >= 0 || rest == 0;
}

/* Splits a flat form whose terms each cover whole digits of their own (a variable times the
   stride of a digit, its range ending below the stride of the first digit it does not cover,
   no constant): each digit is then that variable divided and reduced, so a digit that depends
   on a loop-invariant variable stays invariant (rows and lanes of a packed matmul operand read
   through merged axes). False when the form is not like that. */
static bool tb__ix_group_split(tb__ix *g, const tb__lf *flat, int32_t rank, const int64_t *dims,
                               tb__lf *out) {
    int64_t strides[TB_MAX_RANK];
    int32_t owner[TB_MAX_RANK], i, j, j0;
    if (flat->c != 0 || flat->n < 1) return false;
    tb__ix_contig(rank, dims, strides);
    for (j = 0; j < rank; j++)
        owner[j] = -1;
    for (i = 0; i < flat->n; i++) {
        const tb__ix_var *v = &g->vars[flat->var[i]];
        int64_t f = flat->coef[i], span;
        if (f < 1 || v->lo < 0) return false;
        for (j0 = rank - 1; j0 >= 0 && !(dims[j0] > 1 && strides[j0] == f); j0--) {
        }
        if (j0 < 0 || v->hi >= INT64_MAX / f) return false;
        span = f * (v->hi + 1);
        for (j = j0; j >= 0 && strides[j] < span; j--) {
            if (dims[j] <= 1) continue;
            if (owner[j] >= 0) return false;
            owner[j] = i;
        }
        if (j >= 0 && j < j0 && strides[j] < span) return false;
    }
    for (j = 0; j < rank; j++) {
        tb__lf_const(&out[j], 0);
        if (dims[j] <= 1 || owner[j] < 0) continue;
        {
            int32_t src = flat->var[owner[j]], v;
            int64_t q = strides[j] / flat->coef[owner[j]];
            const tb__ix_var *sv = &g->vars[src];
            bool top = sv->hi / q < dims[j];
            if (top && q == 1) {
                tb__lf_add_term(&out[j], src, 1);
                continue;
            }
            v = tb__ix_new_digit(g, 0, dims[j] - 1, src, q, top ? 0 : dims[j]);
            if (v < 0) return false;
            tb__ix_note_period(g, src, q > 1 ? q : dims[j]);
            if (top) {
                tb__ix_line(g, "const long i%d = i%d / %lldL;", (int)v, (int)src, (long long)q);
            } else if (q == 1) {
                tb__ix_line(g, "const long i%d = i%d %% %lldL;", (int)v, (int)src,
                            (long long)dims[j]);
            } else {
                tb__ix_line(g, "const long i%d = (i%d / %lldL) %% %lldL;", (int)v, (int)src,
                            (long long)q, (long long)dims[j]);
            }
            tb__lf_add_term(&out[j], v, 1);
        }
    }
    return g->status == TB_OK;
}

/* Makes sure the position has its per-dim form: an affine split of the flat form, else
   division and remainder by the contiguous strides. False for the -1 of a position that
   could not be made. */
static bool tb__ix_need_multi(tb__ix *g, int32_t id) {
    tb__pos p;
    tb__lf dims_lf[TB_MAX_RANK];
    int32_t i;
    if (id < 0 || g->status != TB_OK) return false;
    if (g->pos[id].has_multi) return true;
    p = g->pos[id];
    if (!tb__ix_affine_split(g, &p.flat, p.rank, p.dims, dims_lf) &&
        !tb__ix_group_split(g, &p.flat, p.rank, p.dims, dims_lf)) {
        int64_t strides[TB_MAX_RANK];
        uint64_t extra = tb__hash_bytes(tb__hash_bytes(0x756e726176656cull, &p.flat, sizeof p.flat),
                                        p.dims, sizeof p.dims);
        int32_t first = tb__ix_memo_find(g, TB__MEMO_UNRAVEL, p.rank, 0, extra), t, leading = 1;
        tb__ix_contig(p.rank, p.dims, strides);
        if (first < 0) {
            t = tb__ix_spill(g, &p.flat);
            if (t < 0) return false;
            first = (int32_t)g->num_vars;
            for (i = 0; i < p.rank; i++) {
                int32_t v = tb__ix_new_digit(g, 0, p.dims[i] > 0 ? p.dims[i] - 1 : 0, t,
                                             p.dims[i] <= 1 ? INT64_MAX : strides[i],
                                             leading ? 0 : p.dims[i]);
                if (v < 0) return false;
                if (p.dims[i] > 1 && (!leading || strides[i] > 1))
                    tb__ix_note_period(g, t, strides[i] > 1 ? strides[i] : p.dims[i]);
                if (p.dims[i] <= 1) {
                    tb__ix_line(g, "const long i%d = 0;", (int)v);
                } else if (leading) {
                    tb__ix_line(g, "const long i%d = i%d / %lldL;", (int)v, (int)t,
                                (long long)strides[i]);
                } else if (strides[i] == 1) {
                    tb__ix_line(g, "const long i%d = i%d %% %lldL;", (int)v, (int)t,
                                (long long)p.dims[i]);
                } else {
                    tb__ix_line(g, "const long i%d = (i%d / %lldL) %% %lldL;", (int)v, (int)t,
                                (long long)strides[i], (long long)p.dims[i]);
                }
                if (p.dims[i] > 1) leading = 0;
            }
            tb__ix_memo_add(g, TB__MEMO_UNRAVEL, p.rank, 0, extra, first);
        }
        for (i = 0; i < p.rank; i++) {
            tb__lf_const(&dims_lf[i], 0);
            if (p.dims[i] > 1) tb__lf_add_term(&dims_lf[i], first + i, 1);
        }
    }
    for (i = 0; i < p.rank; i++)
        g->pos[id].dim[i] = dims_lf[i];
    g->pos[id].has_multi = 1;
    tb__ix_undo_push(g, id, 2);
    return g->status == TB_OK;
}

/* One run of a regroup: out axes [ta, tb) of `to` take the value of in axes [fa, fb) of
   `from`, where one side has at most one axis of size > 1. */
static bool tb__ix_regroup_run(tb__ix *g, const tb__lf *dims, const tb_shape *from, int32_t fa,
                               int32_t fb, const tb_shape *to, int32_t ta, int32_t tb_,
                               tb__lf *out) {
    int32_t i, big_from = -1, big_to = -1, nf = 0, nt = 0, v, src;
    int64_t stride;
    for (i = fa; i < fb; i++)
        if (from->dims[i] > 1) big_from = i, nf++;
    for (i = ta; i < tb_; i++) {
        tb__lf_const(&out[i], 0);
        if (to->dims[i] > 1) big_to = i, nt++;
    }
    if (nf > 1 && nt > 1) return false;
    if (nt == 0) return true;
    if (nf <= 1 && nt == 1) {
        if (nf == 1) out[big_to] = dims[big_from];
        return true;
    }
    if (nt == 1) { /* several from axes combine into one */
        stride = 1;
        for (i = fb - 1; i >= fa; i--) {
            if (!tb__ix_lf_addmul(g, &out[big_to], &dims[i], stride)) return false;
            stride *= from->dims[i];
        }
        return true;
    }
    /* one from axis unravels into several: affinely where the form's terms fall on whole
       digits, else by division and remainder */
    if (tb__ix_affine_split(g, &dims[big_from], tb_ - ta, &to->dims[ta], &out[ta]) ||
        tb__ix_group_split(g, &dims[big_from], tb_ - ta, &to->dims[ta], &out[ta]))
        return g->status == TB_OK;
    for (i = ta; i < tb_; i++)
        tb__lf_const(&out[i], 0);
    src = tb__ix_spill(g, &dims[big_from]);
    if (src < 0) return false;
    stride = 1;
    for (i = tb_ - 1; i >= ta; i--) {
        if (to->dims[i] <= 1) continue;
        v = tb__ix_new_digit(g, 0, to->dims[i] - 1, src, stride, to->dims[i]);
        if (v < 0) return false;
        tb__ix_note_period(g, src, stride > 1 ? stride : to->dims[i]);
        if (stride == 1) {
            tb__ix_line(g, "const long i%d = i%d %% %lldL;", (int)v, (int)src,
                        (long long)to->dims[i]);
        } else {
            tb__ix_line(g, "const long i%d = (i%d / %lldL) %% %lldL;", (int)v, (int)src,
                        (long long)stride, (long long)to->dims[i]);
        }
        tb__lf_add_term(&out[i], v, 1);
        stride *= to->dims[i];
    }
    return g->status == TB_OK;
}

static bool tb__ix_regroup(tb__ix *g, const tb__lf *dims, const tb_shape *from, const tb_shape *to,
                           tb__lf *out) {
    int32_t i = 0, j = 0;
    for (i = 0; i < from->rank; i++)
        if (from->dims[i] == 0) return false;
    i = 0;
    while (i < from->rank || j < to->rank) {
        int32_t fa = i, ta = j;
        int64_t pf = 1, pt = 1;
        /* a run: the shortest prefixes of equal size, size-1 axes joining the run before them */
        if (i < from->rank) pf = from->dims[i++];
        if (j < to->rank) pt = to->dims[j++];
        while (pf != pt || (i < from->rank && from->dims[i] == 1) ||
               (j < to->rank && to->dims[j] == 1)) {
            if (pf == pt && i < from->rank && from->dims[i] == 1) {
                i++;
            } else if (pf == pt && j < to->rank && to->dims[j] == 1) {
                j++;
            } else if (pf < pt && i < from->rank) {
                pf *= from->dims[i++];
            } else if (pt < pf && j < to->rank) {
                pt *= to->dims[j++];
            } else {
                return false;
            }
        }
        if (!tb__ix_regroup_run(g, dims, from, fa, i, to, ta, j, out)) return false;
    }
    return true;
}

/* A position over `shape` with the given per-dim forms. */
static int32_t tb__ix_pos_multi(tb__ix *g, const tb_shape *shape, const tb__lf *dims) {
    tb__pos q;
    int32_t i;
    tb__ix_pos_init(&q, shape);
    for (i = 0; i < shape->rank; i++)
        q.dim[i] = dims[i];
    q.has_multi = 1;
    return tb__ix_intern(g, &q);
}

static int32_t tb__ix_pos_flat(tb__ix *g, const tb_shape *shape, const tb__lf *flat) {
    tb__pos q;
    tb__ix_pos_init(&q, shape);
    q.flat = *flat;
    q.has_flat = 1;
    return tb__ix_intern(g, &q);
}

/* A position over `shape` whose flat form is var * scale (+ var2 when var2 >= 0). */
static int32_t tb__ix_var_pos_flat(tb__ix *g, const tb_shape *shape, int32_t var, int64_t scale,
                                   int32_t var2) {
    tb__lf lf;
    tb__lf_const(&lf, 0);
    tb__lf_add_term(&lf, var, scale);
    if (var2 >= 0) tb__lf_add_term(&lf, var2, 1);
    return tb__ix_pos_flat(g, shape, &lf);
}

/* Starts a new kernel: empty text at indentation 1, nothing known. */
static void tb__ix_reset(tb__ix *g) {
    tb__str_free(&g->body);
    memset(&g->body, 0, sizeof g->body);
    g->indent = 1;
    g->num_vars = g->num_pos = g->num_memo = g->num_undo = g->num_scopes = 0;
    g->period = 0;
    g->status = TB_OK;
    memset(g->pos_head, 0xff, sizeof g->pos_head);
    memset(g->memo_head, 0xff, sizeof g->memo_head);
}

static void tb__ix_free(tb__ix *g) {
    tb__str_free(&g->body);
    tb__free(g->vars);
    tb__free(g->pos);
    tb__free(g->memo);
    tb__free(g->undo);
    tb__free(g->scopes);
}

#endif /* TB__HAVE_COMPILED_BACKENDS */
