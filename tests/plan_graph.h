/* Plans and programs without a device, for the planner's and the code generator's own tests:
   the graph of lazy tensors made on the cpu backend (nothing runs until they are read), the
   planner's target and the dialect of a described device (the public kit's facts), the plan
   and the program's text; an allocator that fails its n-th request and the cmocka group setup
   that installs it. Included after cmocka.h and torch_backend.h (with TB_IMPLEMENTATION: the
   planner and the renderer are the library's internal parts). */
#ifndef TB_TESTS_PLAN_GRAPH_H
#define TB_TESTS_PLAN_GRAPH_H

#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__) || defined(__clang__)
#define PLAN_GRAPH_UNUSED __attribute__((unused))
#else
#define PLAN_GRAPH_UNUSED
#endif

/* A graph as the executor hands it to a backend: nodes in post-order, the parameters (device
   data and scalars) and the results. */
typedef struct plan_graph {
    const tb_node **nodes, **params, **results;
    size_t num_nodes, num_params, num_results, cap;
    tb_graph g;
} plan_graph;

static bool plan_graph_has(const plan_graph *pg, const tb_node *n) {
    size_t i;
    for (i = 0; i < pg->num_nodes; i++)
        if (pg->nodes[i] == n) return true;
    return false;
}

static void plan_graph_visit(plan_graph *pg, const tb_node *n) {
    size_t k;
    bool param = n->op == TB_OP_DEVICE_DATA || n->op == TB_OP_SCALAR || n->value != NULL;
    if (plan_graph_has(pg, n)) return;
    for (k = 0; !param && k < n->num_operands; k++)
        plan_graph_visit(pg, n->operands[k]);
    if (pg->num_nodes == pg->cap) {
        pg->cap = pg->cap * 2 + 64;
        pg->nodes = (const tb_node **)realloc((void *)pg->nodes, pg->cap * sizeof *pg->nodes);
        pg->params = (const tb_node **)realloc((void *)pg->params, pg->cap * sizeof *pg->params);
        assert_non_null(pg->nodes);
        assert_non_null(pg->params);
    }
    pg->nodes[pg->num_nodes++] = n;
    if (param) pg->params[pg->num_params++] = n;
}

/* The graph computing `roots` (tensors on the cpu device, not yet read). */
static void plan_graph_of(plan_graph *pg, tb_tensor *const *roots, size_t n) {
    size_t i;
    memset(pg, 0, sizeof *pg);
    pg->results = (const tb_node **)calloc(n, sizeof *pg->results);
    assert_non_null(pg->results);
    for (i = 0; i < n; i++) {
        const tb_node *node = tb_tensor_node(roots[i]);
        assert_non_null(node);
        plan_graph_visit(pg, node);
        pg->results[pg->num_results++] = node;
    }
    pg->g.nodes = pg->nodes;
    pg->g.num_nodes = pg->num_nodes;
    pg->g.parameters = pg->params;
    pg->g.num_parameters = pg->num_params;
    pg->g.results = pg->results;
    pg->g.num_results = pg->num_results;
    pg->g.hash = 1;
    assert_int_equal(tb_device_parse("cpu:0", &pg->g.device), TB_OK);
}

static void plan_graph_free(plan_graph *pg) {
    free((void *)pg->nodes);
    free((void *)pg->params);
    free((void *)pg->results);
    memset(pg, 0, sizeof *pg);
}

/* Described devices: CPUs of each vector shape (two cores, 2 MiB of L2 each), a GPU (OpenCL C,
   40 compute units, work-groups of 1024), the C99 host of the native backend. */
enum { DEV_AVX512, DEV_AVX2, DEV_SSE, DEV_GPU, DEV_C99 };

static tb_kit_facts plan_facts(int dev) {
    tb_kit_facts f;
    memset(&f, 0, sizeof f);
    f.language = dev == DEV_C99 ? TB_KIT_C99 : TB_KIT_OPENCL_C;
    f.type = dev == DEV_GPU ? TB_DEVICE_GPU : TB_DEVICE_CPU;
    f.vector_bytes = dev == DEV_AVX512 || dev == DEV_C99 ? 64 : (dev == DEV_AVX2 ? 32 : 16);
    f.vector_registers = f.vector_bytes == 64 ? 32 : 16;
    f.compute_units = dev == DEV_GPU ? 40 : 2;
    f.max_group = dev == DEV_GPU ? 1024 : (dev == DEV_C99 ? 1 : 4096);
    f.max_allocation = (uint64_t)1 << 32;
    f.cache_bytes = (uint64_t)2 << 20;
    f.max_args = dev == DEV_C99 ? 4096 : 128;
    f.buffer_align = 128;
    f.f64 = true;
    f.f64_accumulate = dev != DEV_GPU;
    f.fma = dev != DEV_SSE; /* an SSE-only CPU has none */
    return f;
}

static const char *const plan_dev_names[] = {"AVX-512", "AVX2", "SSE", "GPU", "C99 host"};

/* A host tensor on the cpu device (not yet read by anything: a parameter of the graphs made
   from it), of `rank` of the dims d0, d1, d2; f32 values i * 0.001, other dtypes zeros. */
static PLAN_GRAPH_UNUSED tb_tensor *plan_input(tb_dtype dtype, int32_t rank, int64_t d0, int64_t d1,
                                               int64_t d2) {
    int64_t dims[3], n = 0, i;
    tb_shape s;
    void *buf;
    tb_tensor *t;
    dims[0] = d0;
    dims[1] = d1;
    dims[2] = d2;
    assert_int_equal(tb_shape_make(&s, dtype, rank, dims), TB_OK);
    assert_int_equal(tb_shape_numel(&s, &n), TB_OK);
    buf = calloc((size_t)n, 8);
    assert_non_null(buf);
    for (i = 0; i < n && dtype == TB_F32; i++)
        ((float *)buf)[i] = (float)i * 0.001f;
    t = tb_tensor_from_host(buf, &s, NULL);
    free(buf);
    assert_non_null(t);
    return t;
}

/* A target of its own: a tuning the test may change before it plans. */
typedef struct plan_target {
    tb__tuning tuning;
    tb__target target;
    tb__dialect dialect;
} plan_target;

/* The target of facts f (plan_facts, perhaps changed). */
static PLAN_GRAPH_UNUSED void plan_target_of_facts(plan_target *t, const tb_kit_facts *f) {
    memset(t, 0, sizeof *t);
    tb__kit_target(f, &t->tuning, &t->target, &t->dialect);
    t->target.tuning = &t->tuning;
}

static void plan_target_of(plan_target *t, int dev) {
    tb_kit_facts f = plan_facts(dev);
    plan_target_of_facts(t, &f);
}

/* Plans `roots` for `t`: TB_OK with *plan set (plan_done frees it), or the planner's error. */
static PLAN_GRAPH_UNUSED tb_status plan_of(const plan_target *t, tb_tensor *const *roots, size_t n,
                                           tb__plan **plan) {
    plan_graph pg;
    tb__pgraph G;
    tb_status st;
    *plan = NULL;
    plan_graph_of(&pg, roots, n);
    st = tb__plan_build(&pg.g, &t->target, &G, plan);
    if (st == TB_OK) tb__pgraph_free(&G);
    plan_graph_free(&pg);
    return st;
}

/* Plans and renders: *text the program (free()), *plan as plan_of. */
static PLAN_GRAPH_UNUSED tb_status program_of(const plan_target *t, tb_tensor *const *roots,
                                              size_t n, tb__plan **plan, char **text) {
    plan_graph pg;
    tb__pgraph G;
    tb_status st;
    size_t len = 0;
    *plan = NULL;
    *text = NULL;
    plan_graph_of(&pg, roots, n);
    st = tb__plan_build(&pg.g, &t->target, &G, plan);
    if (st == TB_OK) {
        char *out = NULL;
        st = tb__cg_render(&G, *plan, &t->dialect, &out, &len);
        tb__pgraph_free(&G);
        if (out != NULL) {
            *text = (char *)malloc(len + 1);
            assert_non_null(*text);
            memcpy(*text, out, len);
            (*text)[len] = '\0';
            tb__free(out);
        }
    }
    plan_graph_free(&pg);
    return st;
}

/* ---- an allocator that fails its n-th request once armed ---- */

static long g_fail_at; /* 0: never */
static long g_count;
static bool g_failed;

static void *failing_alloc(size_t size, void *user_data) {
    (void)user_data;
    if (g_fail_at > 0 && ++g_count == g_fail_at) {
        g_failed = true;
        return NULL;
    }
    return malloc(size);
}

static void failing_free(void *ptr, void *user_data) {
    (void)user_data;
    free(ptr);
}

/* the group's setup: the library with the failing allocator (unarmed) */
static int group_setup(void **state) {
    tb_desc desc;
    (void)state;
    memset(&desc, 0, sizeof desc);
    desc.allocator.alloc = failing_alloc;
    desc.allocator.free = failing_free;
    return tb_setup(&desc) == TB_OK ? 0 : -1;
}

static int group_teardown(void **state) {
    (void)state;
    tb_shutdown();
    return 0;
}

#endif
