/* The Philox 4x32-10 generator and the seed state behind tb_rand / tb_randn. */
#define _POSIX_C_SOURCE 200809L
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define TB_IMPLEMENTATION
#include "torch_backend.h"

/* ---- Random123's known-answer tests for philox4x32_10 (kat_vectors) ---- */

static void check_philox(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                         uint32_t k1, uint32_t e0, uint32_t e1, uint32_t e2, uint32_t e3) {
    uint32_t counter[4], key[2], out[4];
    counter[0] = c0;
    counter[1] = c1;
    counter[2] = c2;
    counter[3] = c3;
    key[0] = k0;
    key[1] = k1;
    tb__philox4x32_10(counter, key, out);
    assert_int_equal(out[0], e0);
    assert_int_equal(out[1], e1);
    assert_int_equal(out[2], e2);
    assert_int_equal(out[3], e3);
}

static void test_philox_known_answers(void **state) {
    (void)state;
    check_philox(0, 0, 0, 0, 0, 0, 0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u);
    check_philox(0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu,
                 0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu);
    check_philox(0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u, 0x299f31d0u,
                 0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u);
}

/* ---- the documented mapping from words to values, written out again here ---- */

static void block(uint64_t seed, uint64_t counter, uint32_t w[4]) {
    uint32_t c[4], k[2];
    c[0] = (uint32_t)(counter & 0xffffffffu);
    c[1] = (uint32_t)(counter >> 32);
    c[2] = 0;
    c[3] = 0;
    k[0] = (uint32_t)(seed & 0xffffffffu);
    k[1] = (uint32_t)(seed >> 32);
    tb__philox4x32_10(c, k, w);
}

static double u53(uint32_t a, uint32_t b) {
    uint64_t bits = ((uint64_t)a << 21) | (uint64_t)(b >> 11);
    return ldexp((double)bits, -53);
}

static void test_uniform_f32_formula(void **state) {
    const uint64_t seed = 0x0123456789abcdefull, offset = 7;
    uint64_t i;
    (void)state;
    for (i = 0; i < 40; i++) {
        uint32_t w[4];
        float expected;
        double v;
        block(seed, offset + i / 4, w);
        expected = (float)(w[i % 4] >> 8) * (1.0f / 16777216.0f);
        v = tb__rng_uniform(TB_F32, seed, offset, i);
        assert_true(v == (double)expected);
        assert_true(v >= 0.0 && v < 1.0);
        assert_true((double)(float)v == v); /* exact in f32: no double rounding anywhere */
    }
}

static void test_uniform_f64_formula(void **state) {
    const uint64_t seed = 42, offset = 1000;
    uint64_t i;
    (void)state;
    for (i = 0; i < 40; i++) {
        uint32_t w[4];
        double v = tb__rng_uniform(TB_F64, seed, offset, i);
        block(seed, offset + i / 2, w);
        assert_true(v == u53(w[2 * (i % 2)], w[2 * (i % 2) + 1]));
        assert_true(v >= 0.0 && v < 1.0);
    }
}

/* The counter is 64 bits over words 0 and 1: the low word carries into the high one, and the
   whole counter wraps modulo 2^64. */
static void test_counter_carries_and_wraps(void **state) {
    uint32_t w[4], c[4], k[2];
    (void)state;
    c[0] = 0;
    c[1] = 1;
    c[2] = 0;
    c[3] = 0;
    k[0] = 5;
    k[1] = 0;
    tb__philox4x32_10(c, k, w);
    /* offset 0xffffffff, element 4 (f32): counter 0x1_00000000 */
    assert_true(tb__rng_uniform(TB_F32, 5, 0xffffffffu, 4) ==
                (double)((float)(w[0] >> 8) * (1.0f / 16777216.0f)));
    c[1] = 0;
    tb__philox4x32_10(c, k, w);
    /* offset 2^64 - 1, element 2 (f64): counter wraps to 0 */
    assert_true(tb__rng_uniform(TB_F64, 5, UINT64_MAX, 2) == u53(w[0], w[1]));
}

static void test_normal_formula(void **state) {
    const uint64_t seed = 7, offset = 3;
    uint64_t i;
    (void)state;
    for (i = 0; i < 40; i++) {
        uint32_t w[4];
        double u1, u2, r, t, z;
        block(seed, offset + i / 2, w);
        u1 = u53(w[0], w[1]);
        u2 = u53(w[2], w[3]);
        r = sqrt(-2.0 * log(1.0 - u1));
        t = 6.283185307179586 * u2;
        z = (i % 2 == 0) ? r * cos(t) : r * sin(t);
        assert_true(tb__rng_normal(TB_F64, seed, offset, i) == z);
        assert_true(tb__rng_normal(TB_F32, seed, offset, i) == (double)(float)z);
    }
}

/* Distribution sanity over many draws (loose bounds: many standard errors wide). */
static void test_moments(void **state) {
    const uint64_t n = 200000;
    double su = 0, sn = 0, sn2 = 0, umin = 1, umax = 0;
    uint64_t i;
    (void)state;
    for (i = 0; i < n; i++) {
        double u = tb__rng_uniform(TB_F32, 1, 0, i);
        double z = tb__rng_normal(TB_F64, 1, 0, i);
        su += u;
        sn += z;
        sn2 += z * z;
        if (u < umin) umin = u;
        if (u > umax) umax = u;
    }
    assert_true(fabs(su / (double)n - 0.5) < 0.005);
    assert_true(fabs(sn / (double)n) < 0.01);
    assert_true(fabs(sn2 / (double)n - 1.0) < 0.02);
    assert_true(umin >= 0.0 && umin < 0.001);
    assert_true(umax < 1.0 && umax > 0.999);
}

/* Different seeds and offsets give different streams. */
static void test_streams_differ(void **state) {
    (void)state;
    assert_true(tb__rng_uniform(TB_F64, 1, 0, 0) != tb__rng_uniform(TB_F64, 2, 0, 0));
    assert_true(tb__rng_uniform(TB_F64, 1, 0, 0) != tb__rng_uniform(TB_F64, 1, 1, 0));
    assert_true(tb__rng_uniform(TB_F64, (uint64_t)1 << 32, 0, 0) !=
                tb__rng_uniform(TB_F64, 0, 0, 0));
}

/* ---- the seed state ---- */

static int seeds_seen;
static uint64_t last_seed;

static void seed_hook(void *user_data, uint64_t seed) {
    (void)user_data;
    seeds_seen++;
    last_seed = seed;
}

static tb_status st_from_host(void *u, tb_backend_data *d, const void *h) {
    (void)u;
    (void)d;
    (void)h;
    return TB_OK;
}
static tb_status st_to_host(void *u, const tb_backend_data *d, void *h) {
    (void)u;
    (void)d;
    (void)h;
    return TB_OK;
}
static void st_release(void *u, tb_backend_data *d) {
    (void)u;
    (void)d;
}
static tb_status st_lower(void *u, const tb_graph *g, void **c) {
    (void)u;
    (void)g;
    *c = NULL;
    return TB_OK;
}
static tb_status st_compile(void *u, void *c, void **comp) {
    (void)u;
    (void)c;
    *comp = NULL;
    return TB_OK;
}
static tb_status st_execute(void *u, void *c, tb_backend_data *const *a, size_t na,
                            tb_backend_data *const *r, size_t nr) {
    (void)u;
    (void)c;
    (void)a;
    (void)na;
    (void)r;
    (void)nr;
    return TB_OK;
}
static void st_release_comp(void *u, void *c) {
    (void)u;
    (void)c;
}
static size_t st_devices(void *u, tb_device *out, size_t cap) {
    (void)u;
    if (cap > 0) {
        memset(out, 0, sizeof(*out));
        out[0].type = TB_DEVICE_ACCELERATOR;
    }
    return 1;
}

static void test_reserve_and_manual_seed(void **state) {
    uint64_t seed, offset;
    (void)state;
    tb_manual_seed(5);
    tb__rng_reserve(10, &seed, &offset);
    assert_true(seed == 5 && offset == 0);
    tb__rng_reserve(3, &seed, &offset); /* the first call took ceil(10/2) counters */
    assert_true(seed == 5 && offset == 5);
    tb__rng_reserve(0, &seed, &offset);
    assert_true(offset == 7);
    tb__rng_reserve(1, &seed, &offset);
    assert_true(offset == 7);
    tb_manual_seed(0xfedcba9876543210ull);
    tb__rng_reserve(1, &seed, &offset);
    assert_true(seed == 0xfedcba9876543210ull && offset == 0);
    tb_shutdown();
}

static void test_manual_seed_tells_backends(void **state) {
    tb_backend_impl impl;
    (void)state;
    memset(&impl, 0, sizeof(impl));
    impl.set_rng_seed = seed_hook;
    impl.data_from_host = st_from_host;
    impl.data_to_host = st_to_host;
    impl.data_release = st_release;
    impl.create_lowering_context = st_lower;
    impl.compile = st_compile;
    impl.execute = st_execute;
    impl.release_computation = st_release_comp;
    impl.get_backend_devices = st_devices;
    seeds_seen = 0;
    assert_int_equal(tb_backend_register("seedy", &impl, "debug"), TB_OK);
    tb_manual_seed(1234);
    assert_int_equal(seeds_seen, 1);
    assert_true(last_seed == 1234);
    tb_shutdown();
}

/* An allocator hook that refuses every allocation while `refuse` is set. */
static bool refuse;

static void *refusing_alloc(size_t size, void *user_data) {
    (void)user_data;
    return refuse ? NULL : malloc(size);
}

static void refusing_free(void *ptr, void *user_data) {
    (void)user_data;
    free(ptr);
}

/* tb_manual_seed is all or nothing: it allocates nothing once the backends are registered (it
   used to skip every backend's set_rng_seed when a list could not be allocated, and still
   return as if it had worked), and when registering the built-in backends fails it changes
   nothing and says why. */
static void test_manual_seed_under_allocation_failure(void **state) {
    tb_backend_impl impl;
    tb_desc desc;
    uint64_t seed, offset;
    (void)state;
    memset(&impl, 0, sizeof(impl));
    impl.set_rng_seed = seed_hook;
    impl.data_from_host = st_from_host;
    impl.data_to_host = st_to_host;
    impl.data_release = st_release;
    impl.create_lowering_context = st_lower;
    impl.compile = st_compile;
    impl.execute = st_execute;
    impl.release_computation = st_release_comp;
    impl.get_backend_devices = st_devices;
    memset(&desc, 0, sizeof(desc));
    desc.allocator.alloc = refusing_alloc;
    desc.allocator.free = refusing_free;
    tb_shutdown();
    refuse = false;
    assert_int_equal(tb_setup(&desc), TB_OK);
    assert_int_equal(tb_backend_register("seedy", &impl, NULL), TB_OK);
    seeds_seen = 0;
    refuse = true;
    assert_int_equal(tb_manual_seed(77), TB_OK);
    refuse = false;
    assert_int_equal(seeds_seen, 1);
    assert_true(last_seed == 77);
    tb__rng_reserve(1, &seed, &offset);
    assert_true(seed == 77 && offset == 0);

    /* nothing registered yet, and no memory to register the built-ins: nothing changes */
    tb_shutdown();
    assert_int_equal(tb_setup(&desc), TB_OK);
    tb__rng_reserve(0, &seed, &offset);
    refuse = true;
    assert_int_equal(tb_manual_seed(5), TB_ERR_OUT_OF_MEMORY);
    refuse = false;
    assert_non_null(strstr(tb_last_error(), "tb_manual_seed: cannot register the built-in "
                                            "backend 'cpu': tb: out of memory"));
    {
        uint64_t seed2;
        tb__rng_reserve(0, &seed2, &offset);
        assert_true(seed2 == seed && offset == 0); /* the default seed, untouched */
    }
    assert_int_equal(tb_manual_seed(5), TB_OK);
    tb__rng_reserve(0, &seed, &offset);
    assert_true(seed == 5);
    tb_shutdown();
}

static void test_shutdown_restores_default_seed(void **state) {
    uint64_t seed, offset;
    (void)state;
    tb_manual_seed(99);
    tb__rng_reserve(100, &seed, &offset);
    tb_shutdown();
    tb__rng_reserve(4, &seed, &offset);
    assert_true(seed == 67280421310721ull);
    assert_true(offset == 0);
    tb_shutdown();
}

/* tb_rand / tb_randn follow the documented stream: the values of a call come from the seed and
   the offset the previous calls left. */
static void test_rand_follows_stream(void **state) {
    float a[10], b[3];
    double n[5];
    tb_shape s10 = tb_shape_of(TB_F32, 1, 10), s3 = tb_shape_of(TB_F32, 1, 3);
    tb_shape s5 = tb_shape_of(TB_F64, 1, 5);
    tb_tensor *ta, *tb2, *tn;
    uint64_t i;
    (void)state;
    tb_manual_seed(2024);
    ta = tb_rand(&s10, NULL);
    tb2 = tb_rand(&s3, NULL);
    tn = tb_randn(&s5, NULL);
    assert_non_null(ta);
    assert_non_null(tb2);
    assert_non_null(tn);
    assert_int_equal(tb_tensor_to_host(ta, a, sizeof(a)), TB_OK);
    assert_int_equal(tb_tensor_to_host(tb2, b, sizeof(b)), TB_OK);
    assert_int_equal(tb_tensor_to_host(tn, n, sizeof(n)), TB_OK);
    for (i = 0; i < 10; i++) {
        uint32_t w[4];
        block(2024, 0 + i / 4, w);
        assert_true(a[i] == (float)(w[i % 4] >> 8) * (1.0f / 16777216.0f));
    }
    for (i = 0; i < 3; i++) {
        uint32_t w[4];
        block(2024, 5 + i / 4, w); /* after ceil(10/2) counters */
        assert_true(b[i] == (float)(w[i % 4] >> 8) * (1.0f / 16777216.0f));
    }
    for (i = 0; i < 5; i++) {
        uint32_t w[4];
        double r, t;
        block(2024, 7 + i / 2, w); /* after ceil(3/2) more */
        r = sqrt(-2.0 * log(1.0 - u53(w[0], w[1])));
        t = 6.283185307179586 * u53(w[2], w[3]);
        assert_true(n[i] == ((i % 2 == 0) ? r * cos(t) : r * sin(t)));
    }
    tb_tensor_release(ta);
    tb_tensor_release(tb2);
    tb_tensor_release(tn);
    tb_shutdown();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_philox_known_answers),
        cmocka_unit_test(test_uniform_f32_formula),
        cmocka_unit_test(test_uniform_f64_formula),
        cmocka_unit_test(test_counter_carries_and_wraps),
        cmocka_unit_test(test_normal_formula),
        cmocka_unit_test(test_moments),
        cmocka_unit_test(test_streams_differ),
        cmocka_unit_test(test_reserve_and_manual_seed),
        cmocka_unit_test(test_manual_seed_tells_backends),
        cmocka_unit_test(test_manual_seed_under_allocation_failure),
        cmocka_unit_test(test_shutdown_restores_default_seed),
        cmocka_unit_test(test_rand_follows_stream),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
