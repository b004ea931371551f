/* Scopes (tb_scope_begin, tb_scope_end, tb_scope_keep): a forward pass without a release per
   intermediate, values checked against numbers worked out by hand; nesting, keep moving a tensor
   to the enclosing scope, handles released or retained by their user inside a scope, errors,
   each thread's own scopes, tb_dropout's handed-back input, tensors that an optimizer or a
   tensor set keeps for itself, refused allocations, and tb_shutdown with scopes open. Every
   test runs with a counting allocator: what a scope releases shows as blocks given back, and
   tb_shutdown must leave none. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#define TB_IMPLEMENTATION
#include "torch_backend.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "scratch_dir.h"

/* ---- a counting allocator that can refuse one call ---- */

static long g_live;    /* blocks not yet freed */
static long g_calls;   /* allocations so far */
static long g_fail_at; /* the allocation to refuse (0: none) */

static void *hook_alloc(size_t size, void *user_data) {
    long call = __atomic_add_fetch(&g_calls, 1, __ATOMIC_RELAXED);
    void *p;
    (void)user_data;
    if (call == __atomic_load_n(&g_fail_at, __ATOMIC_RELAXED)) return NULL;
    p = malloc(size);
    if (p != NULL) __atomic_add_fetch(&g_live, 1, __ATOMIC_RELAXED);
    return p;
}

static void hook_free(void *ptr, void *user_data) {
    (void)user_data;
    __atomic_sub_fetch(&g_live, 1, __ATOMIC_RELAXED);
    free(ptr);
}

static long live_blocks(void) {
    return __atomic_load_n(&g_live, __ATOMIC_RELAXED);
}

/* Refuses the next allocation. */
static void refuse_next(void) {
    __atomic_store_n(&g_fail_at, __atomic_load_n(&g_calls, __ATOMIC_RELAXED) + 1, __ATOMIC_RELAXED);
}

static int setup(void **state) {
    tb_desc desc;
    (void)state;
    memset(&desc, 0, sizeof desc);
    desc.allocator.alloc = hook_alloc;
    desc.allocator.free = hook_free;
    desc.backend = "cpu";
    g_live = g_calls = g_fail_at = 0;
    return tb_setup(&desc) == TB_OK ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    tb_shutdown();
    g_fail_at = 0;
    if (live_blocks() != 0) {
        print_error("%ld blocks live after tb_shutdown\n", live_blocks());
        return -1;
    }
    return 0;
}

static int group_setup(void **state) {
    (void)state;
    return scratch_make("tb_scope");
}

static int group_teardown(void **state) {
    (void)state;
    return scratch_remove();
}

/* ---- helpers ---- */

static tb_tensor *f32(const float *v, int rank, int64_t d0, int64_t d1) {
    tb_shape s =
        rank == 1 ? tb_shape_of(TB_F32, 1, (int)d0) : tb_shape_of(TB_F32, 2, (int)d0, (int)d1);
    tb_tensor *t = tb_tensor_from_host(v, &s, NULL);
    if (t == NULL) fail_msg("tb_tensor_from_host: %s", tb_last_error());
    return t;
}

static tb_tensor *ones(int64_t n) {
    tb_shape s = tb_shape_of(TB_F32, 1, (int)n);
    tb_tensor *t = tb_ones(&s, NULL);
    if (t == NULL) fail_msg("tb_ones: %s", tb_last_error());
    return t;
}

/* Reads a float tensor of up to 8 elements and compares it with `want`. */
static void expect_values(tb_tensor *t, const float *want, size_t n) {
    float got[8];
    size_t i;
    assert_true(n <= 8);
    if (tb_tensor_to_host(t, got, n * sizeof(float)) != TB_OK)
        fail_msg("tb_tensor_to_host: %s", tb_last_error());
    for (i = 0; i < n; i++) {
        if (fabsf(got[i] - want[i]) > 1e-5f)
            fail_msg("element %zu: %.7f, expected %.7f", i, (double)got[i], (double)want[i]);
    }
}

/* The README's network: softmax(relu(x @ W + b)) for x [2,3], W [3,2], b [2]. */
static const float g_x[6] = {1, 2, 3, -1, 0, 1};
static const float g_w[6] = {0.5f, -1, 0.25f, 1, -0.5f, 0.5f};
static const float g_b[2] = {0.1f, -0.1f};
/* x @ W + b = [[-0.4, 2.4], [-0.9, 1.4]]; relu zeroes the first column; softmax of [0, a] is
   [1 / (1 + e^a), e^a / (1 + e^a)] */
static const float g_softmax[4] = {0.0831727f, 0.9168273f, 0.1978161f, 0.8021839f};

/* The forward pass inside a scope, no release anywhere; the result is kept. */
static tb_tensor *scoped_forward(tb_tensor *w, tb_tensor *b) {
    tb_tensor *x, *y;
    assert_int_equal(tb_scope_begin(), TB_OK);
    x = f32(g_x, 2, 2, 3);
    y = tb_scope_keep(tb_softmax(tb_relu(tb_add(tb_matmul(x, w), b)), -1));
    assert_int_equal(tb_scope_end(), TB_OK);
    return y;
}

/* Runs the forward pass twice, so that what the first uses set up is there before blocks are
   counted: the device, the cached computation, the metrics of a compile and of a cache hit. */
static void warm_up(tb_tensor *w, tb_tensor *b) {
    int i;
    for (i = 0; i < 2; i++) {
        tb_tensor *y = scoped_forward(w, b);
        assert_non_null(y);
        expect_values(y, g_softmax, 4);
        tb_tensor_release(y);
    }
}

/* ---- tests ---- */

static void test_forward_and_keep(void **state) {
    tb_tensor *w, *b, *y;
    long before;
    (void)state;
    w = f32(g_w, 2, 3, 2);
    b = f32(g_b, 1, 2, 0);
    warm_up(w, b);
    before = live_blocks();
    y = scoped_forward(w, b);
    assert_non_null(y);
    /* the intermediates and x are gone, while y is still a pending graph that reads them */
    assert_non_null(tb_tensor_node(y));
    expect_values(y, g_softmax, 4);
    tb_tensor_release(y);
    assert_int_equal(live_blocks(), before);
    /* a scope with nothing kept gives back everything it made */
    assert_int_equal(tb_scope_begin(), TB_OK);
    assert_non_null(tb_relu(tb_add(tb_matmul(f32(g_x, 2, 2, 3), w), b)));
    assert_int_equal(tb_scope_end(), TB_OK);
    assert_int_equal(live_blocks(), before);
    tb_tensor_release(w);
    tb_tensor_release(b);
}

/* Each body below runs three times: twice so that what the first uses set up is there
   (devices, the cached computations of its graphs, the metrics of a compile and of a cache
   hit), then with the blocks counted: `before` is the count the body must come back to (-1:
   not counted). */
static void check_blocks(long before) {
    if (before >= 0) assert_int_equal(live_blocks(), before);
}

static void run_thrice(void (*body)(long before)) {
    body(-1);
    body(-1);
    body(live_blocks());
}

static void nested_body(long before) {
    tb_tensor *a, *b, *c;
    const float one[3] = {1, 1, 1}, two[3] = {2, 2, 2}, four[3] = {4, 4, 4};
    assert_int_equal(tb_scope_begin(), TB_OK);
    a = ones(3);
    assert_int_equal(tb_scope_begin(), TB_OK);
    b = tb_add(a, a);
    c = tb_scope_keep(tb_mul(b, b));
    assert_ptr_equal(tb_scope_keep(a), a); /* a is the outer scope's: nothing changes */
    assert_int_equal(tb_scope_end(), TB_OK);
    /* b is gone; c belongs to the outer scope now and still computes */
    expect_values(c, four, 3);
    expect_values(a, one, 3);
    /* a second inner scope: what it keeps joins the outer scope too */
    assert_int_equal(tb_scope_begin(), TB_OK);
    b = tb_scope_keep(tb_add(a, a));
    assert_int_equal(tb_scope_end(), TB_OK);
    expect_values(b, two, 3);
    assert_int_equal(tb_scope_end(), TB_OK); /* a, b and c go with the outer scope */
    check_blocks(before);
    assert_int_equal(tb_last_status(), TB_OK);
}

static void test_nested_keep_moves_to_parent(void **state) {
    (void)state;
    run_thrice(nested_body);
}

static void kept_out_body(long before) {
    tb_tensor *k;
    const float three[2] = {3, 3};
    assert_int_equal(tb_scope_begin(), TB_OK);
    assert_int_equal(tb_scope_begin(), TB_OK);
    k = tb_scope_keep(tb_add_scalar(ones(2), 2.0)); /* to the outer scope */
    assert_ptr_equal(tb_scope_keep(k), k);          /* not the inner scope's: nothing changes */
    assert_int_equal(tb_scope_end(), TB_OK);
    assert_ptr_equal(tb_scope_keep(k), k); /* out of every scope: the caller's */
    assert_int_equal(tb_scope_end(), TB_OK);
    expect_values(k, three, 2);
    if (before >= 0) assert_true(live_blocks() > before);
    tb_tensor_release(k);
    check_blocks(before);
}

static void test_kept_out_of_every_scope(void **state) {
    (void)state;
    run_thrice(kept_out_body);
}

static void release_body(long before) {
    tb_tensor *a, *b, *c;
    const float two[2] = {2, 2};
    assert_int_equal(tb_scope_begin(), TB_OK);
    a = ones(2);
    b = tb_add(a, a);
    c = tb_mul(b, b);
    /* code written with a release per handle works inside a scope: nothing is freed twice */
    tb_tensor_release(c);
    tb_tensor_release(a); /* b's graph still reads a */
    expect_values(b, two, 2);
    tb_tensor_release(b);
    check_blocks(before < 0 ? -1 : before + 1); /* freed at once; the scope's record is left */
    assert_int_equal(tb_scope_end(), TB_OK);
    check_blocks(before);
}

static void test_release_inside_scope(void **state) {
    (void)state;
    run_thrice(release_body);
}

static void retain_body(long before) {
    tb_tensor *a, *b;
    const float one[2] = {1, 1}, two[2] = {2, 2};
    assert_int_equal(tb_scope_begin(), TB_OK);
    a = tb_tensor_retain(ones(2)); /* one reference for the scope, one for us */
    b = ones(2);
    tb_tensor_retain(b);
    tb_tensor_release(b); /* our own reference: the scope still drops its one */
    assert_int_equal(tb_scope_end(), TB_OK);
    expect_values(a, one, 2);
    tb_tensor_release(a);
    check_blocks(before);
    /* retained twice, released once inside: one reference left for us after the end */
    assert_int_equal(tb_scope_begin(), TB_OK);
    a = tb_add(ones(2), ones(2));
    tb_tensor_retain(a);
    tb_tensor_retain(a);
    tb_tensor_release(a);
    assert_int_equal(tb_scope_end(), TB_OK);
    expect_values(a, two, 2);
    tb_tensor_release(a);
    check_blocks(before);
}

static void test_retain_inside_scope(void **state) {
    (void)state;
    run_thrice(retain_body);
}

static void test_end_without_begin(void **state) {
    (void)state;
    assert_int_equal(tb_scope_end(), TB_ERR_STATE);
    assert_non_null(strstr(tb_last_error(), "tb_scope_end: no scope is open on this thread"));
    tb_clear_error();
    assert_int_equal(tb_scope_begin(), TB_OK);
    assert_int_equal(tb_scope_end(), TB_OK);
    assert_int_equal(tb_last_status(), TB_OK);
    assert_int_equal(tb_scope_end(), TB_ERR_STATE); /* begins and ends pair up */
    tb_clear_error();
}

static void test_keep_null_and_outside_scopes(void **state) {
    tb_tensor *a;
    (void)state;
    assert_null(tb_scope_keep(NULL));
    assert_int_equal(tb_last_status(), TB_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(tb_last_error(), "tb_scope_keep"));
    tb_clear_error();
    /* a failed op's NULL keeps the op's error, so the chain is checked once */
    assert_int_equal(tb_scope_begin(), TB_OK);
    assert_null(tb_scope_keep(tb_add(ones(2), ones(3))));
    assert_int_equal(tb_last_status(), TB_ERR_SHAPE);
    assert_null(strstr(tb_last_error(), "tb_scope_keep"));
    tb_clear_error();
    assert_int_equal(tb_scope_end(), TB_OK);
    /* with no scope open, keep changes nothing: the handle is the caller's */
    a = ones(2);
    assert_ptr_equal(tb_scope_keep(a), a);
    tb_tensor_release(a);
    assert_int_equal(tb_last_status(), TB_OK);
}

/* ---- threads ---- */

typedef struct thread_work {
    tb_tensor *made; /* made with no scope open on the thread: handed to the main thread */
    tb_status foreign_end;
    bool ok;
} thread_work;

static void *thread_body(void *arg) {
    thread_work *w = (thread_work *)arg;
    tb_shape vec = tb_shape_of(TB_F32, 1, 2), scalar = tb_shape_of(TB_F32, 0);
    tb_tensor *k;
    float got = 0;
    /* the main thread's open scope is not this thread's */
    w->foreign_end = tb_scope_end();
    tb_clear_error();
    w->made = tb_full(&vec, 5.0, NULL); /* no scope open here: the caller's */
    /* a scope of this thread's own */
    if (tb_scope_begin() != TB_OK) return NULL;
    k = tb_scope_keep(tb_add_scalar(tb_mul_scalar(tb_full(&scalar, 2.0, NULL), 3.0), 7.0));
    if (tb_scope_end() != TB_OK) return NULL;
    w->ok = w->made != NULL && k != NULL && tb_tensor_to_host(k, &got, sizeof got) == TB_OK &&
            got == 13.0f;
    tb_tensor_release(k);
    return NULL;
}

static void threads_body(long before) {
    pthread_t th;
    thread_work work;
    tb_tensor *mine;
    const float five[2] = {5, 5}, one[2] = {1, 1};
    memset(&work, 0, sizeof work);
    assert_int_equal(tb_scope_begin(), TB_OK);
    mine = ones(2);
    assert_int_equal(pthread_create(&th, NULL, thread_body, &work), 0);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(work.foreign_end, TB_ERR_STATE);
    assert_true(work.ok);
    expect_values(mine, one, 2);
    assert_int_equal(tb_scope_end(), TB_OK); /* releases `mine`, not the other thread's tensor */
    expect_values(work.made, five, 2);
    tb_tensor_release(work.made);
    check_blocks(before);
}

static void test_threads_have_their_own_scopes(void **state) {
    (void)state;
    run_thrice(threads_body);
}

/* Threads running scoped forward passes at once on shared weights: their scopes and the
   shared list of open scopes stay apart (tools/test.sh runs this file under ASan; it is clean
   under clang's -fsanitize=thread too). */
typedef struct pass_work {
    tb_tensor *w, *b;
    int right;
} pass_work;

static tb_status forward_pass(tb_tensor *w, tb_tensor *b, float got[4]);

static void *passes_body(void *arg) {
    pass_work *pw = (pass_work *)arg;
    int i, k;
    for (i = 0; i < 25; i++) {
        float got[4];
        bool ok;
        if (tb_scope_begin() != TB_OK) return NULL; /* an outer scope of its own */
        ok = forward_pass(pw->w, pw->b, got) == TB_OK;
        for (k = 0; k < 4 && ok; k++)
            ok = fabsf(got[k] - g_softmax[k]) <= 1e-5f;
        if (tb_scope_end() != TB_OK) return NULL;
        pw->right += ok;
    }
    return NULL;
}

static void test_threads_at_once(void **state) {
    pthread_t th[4];
    pass_work work[4];
    tb_tensor *w, *b;
    int i;
    (void)state;
    w = f32(g_w, 2, 3, 2);
    b = f32(g_b, 1, 2, 0);
    warm_up(w, b);
    for (i = 0; i < 4; i++) {
        work[i].w = w;
        work[i].b = b;
        work[i].right = 0;
        assert_int_equal(pthread_create(&th[i], NULL, passes_body, &work[i]), 0);
    }
    for (i = 0; i < 4; i++) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
        assert_int_equal(work[i].right, 25);
    }
    tb_tensor_release(w);
    tb_tensor_release(b);
}

/* A thread that ends with its scopes open: tb_shutdown releases what they own. */
static void *thread_leaves_scope_open(void *arg) {
    (void)arg;
    if (tb_scope_begin() == TB_OK) {
        tb_shape s = tb_shape_of(TB_F32, 2, 3, 3);
        tb_tensor *e = tb_eye(3, -1, TB_F32, NULL);
        (void)tb_matmul(e, tb_ones(&s, NULL));
    }
    return NULL;
}

static void test_shutdown_with_scopes_open(void **state) {
    pthread_t th;
    tb_tensor *a, *b;
    (void)state;
    assert_int_equal(tb_scope_begin(), TB_OK);
    a = ones(4);
    assert_int_equal(tb_scope_begin(), TB_OK);
    b = tb_exp(a);
    assert_non_null(b);
    assert_int_equal(tb_scope_begin(), TB_OK); /* an empty one */
    assert_int_equal(pthread_create(&th, NULL, thread_leaves_scope_open, NULL), 0);
    assert_int_equal(pthread_join(th, NULL), 0);
    tb_shutdown();
    assert_int_equal(live_blocks(), 0);
    /* shutdown ended them: no scope is open any more */
    assert_int_equal(tb_scope_end(), TB_ERR_STATE);
    tb_clear_error();
    /* set up again: scopes work as before */
    assert_int_equal(setup(NULL), 0);
    assert_int_equal(tb_scope_begin(), TB_OK);
    a = ones(2);
    assert_non_null(tb_neg(a));
    assert_int_equal(tb_scope_end(), TB_OK);
    assert_int_equal(tb_scope_end(), TB_ERR_STATE);
    tb_clear_error();
}

/* ---- what hands back a tensor you already have, what keeps tensors for itself ---- */

static void dropout_body(long before) {
    tb_tensor *x, *h, *y, *z;
    const float one[2] = {1, 1};
    x = ones(2);
    assert_int_equal(tb_scope_begin(), TB_OK);
    h = tb_add(x, x);
    y = tb_dropout(h, 0.5, false); /* h itself, a second reference: the scope owns both */
    assert_ptr_equal(y, h);
    tb_tensor_release(tb_dropout(h, 0.5, false)); /* a third reference, released at once */
    z = tb_dropout(x, 0.5, false); /* x is in no scope: the scope owns this one reference */
    assert_ptr_equal(z, x);
    assert_int_equal(tb_scope_begin(), TB_OK);
    y = tb_dropout(h, 0.0, true); /* h is the outer scope's: that scope owns this one too */
    assert_int_equal(tb_scope_end(), TB_OK);
    assert_ptr_equal(y, h);
    assert_int_equal(tb_scope_end(), TB_OK);
    expect_values(x, one, 2); /* ours still */
    tb_tensor_release(x);
    check_blocks(before);
}

static void test_dropout_hands_back_its_input(void **state) {
    (void)state;
    run_thrice(dropout_body);
}

static void test_library_objects_keep_their_tensors(void **state) {
    const float pv[2] = {1, -2}, after[2] = {0.9f, -1.9f};
    tb_tensor *p, *grads[1], *loss, *q;
    tb_optimizer *opt;
    tb_optimizer_desc desc = tb_adam_desc(0.1);
    tb_tensor_set *set, *loaded;
    const char *path = path_of("scope.safetensors");
    (void)state;
    p = f32(pv, 1, 2, 0);
    assert_int_equal(tb_set_requires_grad(p, true), TB_OK);
    /* a training step in a scope: the optimizer's state is made in it, yet is the optimizer's */
    assert_int_equal(tb_scope_begin(), TB_OK);
    opt = tb_optimizer_new(&desc, &p, 1);
    assert_non_null(opt);
    loss = tb_sum(tb_mul(p, p), NULL, 0, false);
    assert_int_equal(tb_grad(loss, NULL, &p, 1, grads), TB_OK);
    assert_int_equal(tb_optimizer_step(opt, grads, &loss, 1), TB_OK);
    /* a tensor set: one tensor added (the set retains it), one file loaded */
    set = tb_tensor_set_new();
    assert_non_null(set);
    assert_int_equal(tb_tensor_set_add(set, "twice", tb_mul_scalar(p, 2.0)), TB_OK);
    assert_int_equal(tb_safetensors_save(path, set), TB_OK);
    loaded = tb_safetensors_load(path, NULL);
    assert_non_null(loaded);
    assert_int_equal(tb_scope_end(), TB_OK);
    expect_values(p, after, 2);
    /* the state survived the scope: a second step reads it (PyTorch's numbers) */
    assert_int_equal(tb_scope_begin(), TB_OK);
    loss = tb_sum(tb_mul(p, p), NULL, 0, false);
    assert_int_equal(tb_grad(loss, NULL, &p, 1, grads), TB_OK);
    assert_int_equal(tb_optimizer_step(opt, grads, &loss, 1), TB_OK);
    assert_int_equal(tb_scope_end(), TB_OK);
    assert_int_equal(tb_optimizer_steps(opt), 2);
    {
        const float twice[2] = {1.8f, -3.8f}, p2[2] = {0.8004122f, -1.8001665f};
        expect_values(tb_tensor_set_get(set, "twice"), twice, 2);
        expect_values(tb_tensor_set_get(loaded, "twice"), twice, 2);
        expect_values(p, p2, 2);
    }
    q = tb_tensor_set_get(loaded, "twice");
    assert_non_null(q);
    tb_optimizer_free(opt);
    tb_tensor_set_free(set);
    tb_tensor_set_free(loaded);
    tb_tensor_release(p);
}

/* ---- refused allocations ---- */

/* The scoped forward pass read back: TB_OK with the values in `got`, or the first error. */
static tb_status forward_pass(tb_tensor *w, tb_tensor *b, float got[4]) {
    tb_shape xs = tb_shape_of(TB_F32, 2, 2, 3);
    tb_tensor *x, *y;
    tb_status st = tb_scope_begin();
    if (st != TB_OK) return st;
    x = tb_tensor_from_host(g_x, &xs, NULL);
    y = tb_scope_keep(tb_softmax(tb_relu(tb_add(tb_matmul(x, w), b)), -1));
    st = tb_scope_end(); /* TB_OK: a scope is open (no assertion: threads call this too) */
    if (st == TB_OK)
        st = y != NULL ? tb_tensor_to_host(y, got, 4 * sizeof(float)) : tb_last_status();
    tb_tensor_release(y);
    return st;
}

static void test_refused_allocations(void **state) {
    tb_tensor *w, *b;
    long before, n, pass;
    int errors = 0, absorbed = 0;
    float got[4];
    (void)state;
    w = f32(g_w, 2, 3, 2);
    b = f32(g_b, 1, 2, 0);
    warm_up(w, b);
    /* begin refused: a clean error, and no scope is open */
    refuse_next();
    assert_int_equal(tb_scope_begin(), TB_ERR_OUT_OF_MEMORY);
    assert_non_null(strstr(tb_last_error(), "tb_scope_begin: out of memory"));
    tb_clear_error();
    assert_int_equal(tb_scope_end(), TB_ERR_STATE);
    tb_clear_error();
    /* an op refused inside a scope: NULL with the error, and the scope still cleans up */
    before = live_blocks();
    assert_int_equal(tb_scope_begin(), TB_OK);
    refuse_next();
    assert_null(tb_scope_keep(tb_relu(tb_add(w, b))));
    assert_int_equal(tb_last_status(), TB_ERR_OUT_OF_MEMORY);
    tb_clear_error();
    assert_int_equal(tb_scope_end(), TB_OK);
    assert_int_equal(live_blocks(), before);
    /* every allocation of a scoped forward pass refused in turn: an error or the right values,
       never a scope left open, and every block back once the result is released */
    pass = __atomic_load_n(&g_calls, __ATOMIC_RELAXED);
    assert_int_equal(forward_pass(w, b, got), TB_OK);
    pass = __atomic_load_n(&g_calls, __ATOMIC_RELAXED) - pass;
    before = live_blocks();
    for (n = 1; n <= pass + 1; n++) {
        tb_status st;
        __atomic_store_n(&g_fail_at, __atomic_load_n(&g_calls, __ATOMIC_RELAXED) + n,
                         __ATOMIC_RELAXED);
        st = forward_pass(w, b, got);
        __atomic_store_n(&g_fail_at, 0, __ATOMIC_RELAXED);
        if (st != TB_OK) {
            assert_int_equal(st, TB_ERR_OUT_OF_MEMORY);
            assert_true(tb_last_error()[0] != '\0');
            tb_clear_error();
            errors++;
        } else {
            int i;
            for (i = 0; i < 4; i++)
                assert_true(fabsf(got[i] - g_softmax[i]) <= 1e-5f);
            absorbed++;
        }
        assert_int_equal(tb_scope_end(), TB_ERR_STATE); /* no scope left open */
        tb_clear_error();
        assert_int_equal(live_blocks(), before);
    }
    assert_true(errors > 0);
    assert_true(absorbed > 0); /* n = pass + 1 is past the pass */
    tb_tensor_release(w);
    tb_tensor_release(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_forward_and_keep, setup, teardown),
        cmocka_unit_test_setup_teardown(test_nested_keep_moves_to_parent, setup, teardown),
        cmocka_unit_test_setup_teardown(test_kept_out_of_every_scope, setup, teardown),
        cmocka_unit_test_setup_teardown(test_release_inside_scope, setup, teardown),
        cmocka_unit_test_setup_teardown(test_retain_inside_scope, setup, teardown),
        cmocka_unit_test_setup_teardown(test_end_without_begin, setup, teardown),
        cmocka_unit_test_setup_teardown(test_keep_null_and_outside_scopes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_threads_have_their_own_scopes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_threads_at_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_shutdown_with_scopes_open, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dropout_hands_back_its_input, setup, teardown),
        cmocka_unit_test_setup_teardown(test_library_objects_keep_their_tensors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refused_allocations, setup, teardown),
    };
    return cmocka_run_group_tests_name("scope", tests, group_setup, group_teardown);
}
