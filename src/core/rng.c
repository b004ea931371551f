/* ===========================================================================================
   RNG: Philox 4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC11), the
   same counter-based generator on every backend, so that a seed gives the same bits everywhere.
   =========================================================================================== */

#define TB__PHILOX_M0 0xD2511F53u
#define TB__PHILOX_M1 0xCD9E8D57u
#define TB__PHILOX_W0 0x9E3779B9u
#define TB__PHILOX_W1 0xBB67AE85u

/* PyTorch's default CPU generator seed, so that an unseeded program behaves the same on every
   run. */
#define TB__RNG_DEFAULT_SEED 67280421310721ull

static void tb__philox4x32_10(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c0 = counter[0], c1 = counter[1], c2 = counter[2], c3 = counter[3];
    uint32_t k0 = key[0], k1 = key[1];
    int round;
    for (round = 0; round < 10; round++) {
        uint64_t p0, p1;
        if (round > 0) {
            k0 += TB__PHILOX_W0;
            k1 += TB__PHILOX_W1;
        }
        p0 = (uint64_t)TB__PHILOX_M0 * c0;
        p1 = (uint64_t)TB__PHILOX_M1 * c2;
        c0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        c1 = (uint32_t)p1;
        c2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c3 = (uint32_t)p0;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* The four words of counter `offset + block` under `seed`. */
static void tb__rng_block(uint64_t seed, uint64_t offset, uint64_t block, uint32_t out[4]) {
    uint64_t c = offset + block; /* wraps modulo 2^64 by design */
    uint32_t counter[4];
    uint32_t key[2];
    counter[0] = (uint32_t)c;
    counter[1] = (uint32_t)(c >> 32);
    counter[2] = 0;
    counter[3] = 0;
    key[0] = (uint32_t)seed;
    key[1] = (uint32_t)(seed >> 32);
    tb__philox4x32_10(counter, key, out);
}

/* A 53-bit uniform in [0, 1) from two words; integer arithmetic, then one exact scaling. */
static double tb__rng_u53(uint32_t hi, uint32_t lo) {
    uint64_t bits = ((uint64_t)hi << 21) | (uint64_t)(lo >> 11);
    return (double)bits / 9007199254740992.0; /* 2^53 */
}

static double tb__rng_uniform(tb_dtype dtype, uint64_t seed, uint64_t offset, uint64_t index) {
    uint32_t w[4];
    if (dtype == TB_F64) {
        unsigned pair = (unsigned)(index % 2u);
        tb__rng_block(seed, offset, index / 2u, w);
        return tb__rng_u53(w[2 * pair], w[2 * pair + 1]);
    }
    tb__rng_block(seed, offset, index / 4u, w);
    /* 24 bits fit a float's significand: the float and double paths give the same value */
    return (double)(w[index % 4u] >> 8) / 16777216.0; /* 2^24 */
}

static double tb__rng_normal(tb_dtype dtype, uint64_t seed, uint64_t offset, uint64_t index) {
    uint32_t w[4];
    double u1, u2, r, t, z;
    tb__rng_block(seed, offset, index / 2u, w);
    u1 = tb__rng_u53(w[0], w[1]);
    u2 = tb__rng_u53(w[2], w[3]);
    /* 1 - u1 is exact and lies in (0, 1], so the log is finite */
    r = sqrt(-2.0 * log(1.0 - u1));
    t = 6.283185307179586 * u2;
    z = (index % 2u == 0) ? r * cos(t) : r * sin(t);
    if (dtype == TB_F64) return z;
    return (double)(float)z;
}

static tb__mutex tb__rng_mutex = TB__MUTEX_INIT;
static uint64_t tb__rng_seed = TB__RNG_DEFAULT_SEED;
static uint64_t tb__rng_offset = 0;

static void tb__rng_reserve(uint64_t numel, uint64_t *seed, uint64_t *offset) {
    tb__mutex_lock(&tb__rng_mutex);
    *seed = tb__rng_seed;
    *offset = tb__rng_offset;
    tb__rng_offset += numel / 2u + numel % 2u;
    tb__mutex_unlock(&tb__rng_mutex);
}

static void tb__rng_set_seed(uint64_t seed) {
    tb__mutex_lock(&tb__rng_mutex);
    tb__rng_seed = seed;
    tb__rng_offset = 0;
    tb__mutex_unlock(&tb__rng_mutex);
}

static void tb__rng_reset(void) {
    tb__rng_set_seed(TB__RNG_DEFAULT_SEED);
}

#undef TB__PHILOX_M0
#undef TB__PHILOX_M1
#undef TB__PHILOX_W0
#undef TB__PHILOX_W1
