/* The compiled-backend suite, graphs. Seeded random graphs: random DAGs of every op against the cpu
   backend, wide graphs, the relations of vector operands, and growth of the matmul core key table.
   Part of tests/backend_suite/suite.c. */

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

/* in the order they run */
static const struct CMUnitTest graphs_tests[] = {
    cmocka_unit_test(test_vector_reduce_broadcast_operand),
    cmocka_unit_test(test_vector_operand_relations),
    cmocka_unit_test(test_matmul_core_key_table_growth),
    cmocka_unit_test(test_random_wide_graphs),
    cmocka_unit_test(test_random_graphs),
};
