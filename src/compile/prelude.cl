/* torch_backend.h: helpers at the top of every generated program, after the dialect's head
   (which defines TB_FN, the storage of these helpers, and TB_HAS_F64 where doubles work).
   Written in the subset OpenCL C 1.2 and C99 share. */

/* Float to integer as the reference converts: toward zero, saturating at the int64 range,
   NaN gives 0; the caller wraps the result to narrower types. */
TB_FN long tb_f2i_f32(float x) {
    if (isnan(x)) return 0;
    if (x >= 9223372036854775808.0f) return LONG_MAX;
    if (x <= -9223372036854775808.0f) return LONG_MIN;
    return (long)x;
}

#ifdef TB_HAS_F64
TB_FN long tb_f2i_f64(double x) {
    if (isnan(x)) return 0;
    if (x >= 9223372036854775808.0) return LONG_MAX;
    if (x <= -9223372036854775808.0) return LONG_MIN;
    return (long)x;
}
#endif

/* 16-bit floats as bits (in a uint) to float and back, as the reference converts: to nearest
   even, overflow to infinity, subnormals kept, NaN stays NaN. TB_BITS_F32 and TB_F32_BITS are
   the dialect's reinterpretations; a dialect whose compiler converts f16 itself defines
   TB_HAS_F16_CVT and its own tb_f2h and tb_rnd_f16. */
TB_FN float tb_h2f(uint h) {
    /* without branches: exponent and mantissa as an f32 scaled by 2^112 (exact), infinity and
       NaN given the all-ones exponent; subnormals as m * 2^-24 (an f32 subnormal would be
       flushed to zero where a device does so); then the sign */
    uint em = (h & 0x7fffu) << 13;
    uint u = TB_F32_BITS(TB_BITS_F32(em) * 5.192296858534828e+33f);
    uint sub = TB_F32_BITS((float)(h & 0x3ffu) * 5.9604644775390625e-8f);
    u = em < 0x00800000u ? sub : (u | (em >= 0x0f800000u ? 0x7f800000u : 0u));
    return TB_BITS_F32(u | ((h & 0x8000u) << 16));
}

#ifndef TB_HAS_F16_CVT
/* v >> s rounded to nearest, ties to even (0 < s < 32). */
TB_FN uint tb_shr_rne(uint v, uint s) {
    uint q = v >> s, rem = v & ((1u << s) - 1u), mid = 1u << (s - 1u);
    return q + ((rem > mid || (rem == mid && (q & 1u) != 0u)) ? 1u : 0u);
}

TB_FN uint tb_f2h(float f) {
    uint u = TB_F32_BITS(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00u | ((a >> 13) & 0x3ffu);
    if (a >= 0x477ff000u) return sign | 0x7c00u;
    if (a >= 0x38800000u) return sign | tb_shr_rne(a - 0x38000000u, 13u);
    if ((a >> 23) < 102u) return sign;
    return sign | tb_shr_rne((a & 0x7fffffu) | 0x800000u, 126u - (a >> 23));
}

TB_FN float tb_rnd_f16(float x) {
    return tb_h2f(tb_f2h(x));
}
#endif


/* Polynomials by Horner's rule: F(a, b, c) is a * b + c with c a constant, L(c) the first
   constant as the value's type. TB_ERF_R and TB_ERF_S: tb_erf_f32's fits; TB_EXP_P: exp's
   (Cephes' polynomial). */
#define TB_ERF_R(t, F, L)                                                                          \
    F(F(F(F(F(F(L(7.853837559e-05f), t, -8.010181112e-04f), t, 5.188325515e-03f), t,              \
              -2.685381027e-02f),                                                                  \
            t, 1.128358509e-01f),                                                                  \
          t, -3.761262582e-01f),                                                                   \
        t, 1.28379166e-01f)
#define TB_ERF_S(u, F, L)                                                                          \
    F(F(F(F(F(F(F(F(L(-1.136845029e-02f), u, 3.796893243e-02f), u, 4.091299455e-03f), u,           \
                -2.191441179e-01f),                                                                \
              u, 4.809923169e-01f),                                                                \
            u, -4.646903700e-01f),                                                                 \
          u, 4.016589794e-02f),                                                                    \
        u, 5.593148879e-01f),                                                                      \
      u, 2.531519238e-04f)
#define TB_EXP_P(r, F, L)                                                                          \
    F(F(F(F(F(L(1.9875691500e-4f), r, 1.3981999507e-3f), r, 8.3334519073e-3f), r,                  \
          4.1665795894e-2f),                                                                       \
        r, 1.6666665459e-1f),                                                                      \
      r, 5.0000001201e-1f)
#define TB_SAME(c) (c)
#define TB_MULADD(a, b, c) ((a) * (b) + (c))

/* a where c is set, else b, as a blend of their bits: no branch on c, which compilers make of
   a ternary when the data (a dropout mask, a max pool's window) would mispredict it. */
TB_FN float tb_sel_f32(int c, float a, float b) {
    const uint m = 0u - (uint)(c != 0);
    return TB_BITS_F32((TB_F32_BITS(a) & m) | (TB_F32_BITS(b) & ~m));
}

/* exp of an f32 value without calls or branches (the dialects' f32 exp: a loop around it
   vectorises where a call would not), as tb_vexp without TB_VSCALEF: about 1 ulp, overflow
   to +inf, underflow through the denormals to 0, NaN stays NaN. */
TB_FN float tb_exp_f32(float x) {
    float xc = x != x ? 0.0f : x, k, r, p;
    int ki, k1;
    xc = xc < -104.0f ? -104.0f : (xc > 89.0f ? 89.0f : xc);
    k = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* rounded to nearest */
    r = xc - k * 0.693359375f + k * 2.12194440e-4f;
    p = TB_EXP_P(r, TB_MULADD, TB_SAME) * (r * r) + (r + 1.0f);
    ki = (int)k;
    k1 = ki >> 1; /* 2^k as two factors: denormal results are reached too */
    p = p * TB_BITS_F32((uint)(k1 + 127) << 23) * TB_BITS_F32((uint)(ki - k1 + 127) << 23);
    p = x > 88.72283935546875f ? INFINITY : p;
    p = x < -103.97208404541015625f ? 0.0f : p;
    return x != x ? x : p;
}

/* erf of f32 values without calls or branches, so that a compiler or a device vectorises it
   (libm's and PoCL's erff are calls per element, 20-40x the cost of exp): within 1.5 ulp of
   the true value. |x| < 1: x + x R(x^2); from 1 on: 1 - exp(-a^2) S(1 / a) with a = |x|
   clamped to 4 (beyond 3.92 erf rounds to 1 in f32), the sign put back; NaN stays NaN. R and
   S are least-squares fits of erf(x) / x - 1 and erfc(a) exp(a^2), weighted to relative
   error. tb_erfc_mid: erfc(a) with a >= 0 clamped to [1, 4]. */
TB_FN float tb_erfc_mid(float a) {
    float c = a > 4.0f ? 4.0f : (a < 1.0f ? 1.0f : a);
    return tb_exp_f32(-(c * c)) * TB_ERF_S(1.0f / c, TB_MULADD, TB_SAME);
}

TB_FN float tb_erf_f32(float x) {
    float a = fabs(x), big;
    big = 1.0f - tb_erfc_mid(a);
    big = x < 0.0f ? -big : big;
    return x != x ? x : (a < 1.0f ? x + x * TB_ERF_R(x * x, TB_MULADD, TB_SAME) : big);
}

/* gelu of f32 values, x (1 + erf(x / sqrt 2)) / 2, with 1 + erf(z) for z <= -1 taken as
   erfc(-z) itself (no cancellation: a few ulp where PyTorch's f32 form loses all digits),
   and as 0 below -4 (as that form gives; -inf stays NaN as in the reference). */
TB_FN float tb_gelu_f32(float x) {
    float z = x * 0.707106769f, a = fabs(z), c, s;
    c = tb_erfc_mid(a);
    s = z < 0.0f ? (a > 4.0f ? 0.0f : c) : 2.0f - c;
    return 0.5f * x * (a < 1.0f ? 1.0f + (z + z * TB_ERF_R(z * z, TB_MULADD, TB_SAME)) : s);
}

/* mish of f32 values without calls, as the vector form: x n / (n + 2) with n = e (e + 2), e =
   exp(x), and x itself above 20; below -80, where e would lose its bits in the denormals,
   x e^x (mish's value there to f32's precision) as (x exp(x + 40)) e^-40. NaN stays NaN, -inf
   gives NaN (-inf * 0, as the reference). */
TB_FN float tb_mish_f32(float x) {
    float e = tb_exp_f32(x > 20.0f ? 20.0f : (x < -80.0f ? x + 40.0f : x)), n = e * (e + 2.0f);
    float r = x < -80.0f ? (x * e) * 4.24835426e-18f : x * (n / (n + 2.0f));
    return x > 20.0f ? x : r;
}

TB_FN float tb_bf2f(uint h) {
    return TB_BITS_F32(h << 16);
}

TB_FN uint tb_f2bf(float f) {
    uint u = TB_F32_BITS(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40u;
    return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

/* A float rounded to the nearest bf16 value (still a float); tb_rnd_f16 likewise for f16. */
TB_FN float tb_rnd_bf16(float x) {
    return tb_bf2f(tb_f2bf(x));
}

/* Integer power by squaring with wrapping products; the caller reports negative exponents. */
TB_FN long tb_ipow(long base, long e) {
    ulong r = 1, b = (ulong)base;
    if (e < 0) return 0;
    while (e > 0) {
        if (e & 1) r *= b;
        e >>= 1;
        if (e > 0) b *= b;
    }
    return (long)r;
}

/* The four words of a Philox block. */
typedef struct tb_words {
    uint x, y, z, w;
} tb_words;

/* Philox 4x32-10 of counter offset + block under seed: the library's random stream. */
TB_FN tb_words tb_philox(ulong seed, ulong offset, ulong block) {
    ulong c = offset + block;
    uint c0 = (uint)c, c1 = (uint)(c >> 32), c2 = 0, c3 = 0;
    uint k0 = (uint)seed, k1 = (uint)(seed >> 32);
    tb_words out;
    int round;
    for (round = 0; round < 10; round++) {
        ulong p0, p1;
        if (round > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        p0 = (ulong)0xD2511F53u * (ulong)c0;
        p1 = (ulong)0xCD9E8D57u * (ulong)c2;
        c0 = (uint)(p1 >> 32) ^ c1 ^ k0;
        c1 = (uint)p1;
        c2 = (uint)(p0 >> 32) ^ c3 ^ k1;
        c3 = (uint)p0;
    }
    out.x = c0;
    out.y = c1;
    out.z = c2;
    out.w = c3;
    return out;
}

/* Uniform [0, 1) with 24 random bits: exact in float. */
TB_FN float tb_rand_f32(ulong seed, ulong offset, ulong index) {
    tb_words w = tb_philox(seed, offset, index / 4);
    uint sel = (uint)(index % 4);
    /* the word by its two bits, each a choice of two (compilers turn a chain of tests on sel
       into a switch, which Oclgrind 21.10 runs wrong) */
    uint lo = (sel & 1u) != 0 ? w.y : w.x, hi = (sel & 1u) != 0 ? w.w : w.z;
    uint x = (sel & 2u) != 0 ? hi : lo;
    return (float)(x >> 8) / 16777216.0f;
}

#ifdef TB_HAS_F64
TB_FN double tb_u53(uint hi, uint lo) {
    ulong bits = ((ulong)hi << 21) | (ulong)(lo >> 11);
    return (double)bits / 9007199254740992.0;
}

TB_FN double tb_rand_f64(ulong seed, ulong offset, ulong index) {
    tb_words w = tb_philox(seed, offset, index / 2);
    return (index % 2 == 0) ? tb_u53(w.x, w.y) : tb_u53(w.z, w.w);
}

/* Box-Muller on the pair of uniforms of block index / 2: cos for even, sin for odd. */
TB_FN double tb_randn_f64(ulong seed, ulong offset, ulong index) {
    tb_words w = tb_philox(seed, offset, index / 2);
    double u1 = tb_u53(w.x, w.y), u2 = tb_u53(w.z, w.w);
    double r = sqrt(-2.0 * log(1.0 - u1));
    double t = 6.283185307179586 * u2;
    return (index % 2 == 0) ? r * cos(t) : r * sin(t);
}

TB_FN float tb_randn_f32(ulong seed, ulong offset, ulong index) {
    return (float)tb_randn_f64(seed, offset, index);
}
#endif

#ifdef TB_HAS_VEC
/* Vectors of TB_VW floats (4, 8 or 16: the device's own width) for rows read in order: the
   dialect's head defines tb_vf, tb_vi and tb_vu (float, int and uint vectors of TB_VW lanes),
   TB_VBC (a scalar widened), TB_VSEL(a, b, m) (b where the mask m is set, else a), TB_VCVTI
   and TB_VCVTF (float to int and int to float, lane by lane), TB_VASF (int bits as float;
   TB_VASU and TB_VASFU: float bits as uint and back), TB_VSTORE (the lanes into an array of
   floats), TB_VEXP and TB_VLOG (exp and log of each lane: the device's built-ins where it has
   vector ones, which on PoCL are faster than the polynomials below; tb_vexp and tb_vlog where
   the dialect has none). */

/* exp of each lane (Cephes' polynomial after reduction by ln 2, about 1 ulp): overflow gives
   +inf, underflow 0 through the denormals, NaN stays NaN. Where the dialect has TB_VSCALEF
   (p * 2^k rounded once, to inf above the range and through the denormals to 0 below it),
   that one step scales; a NaN goes through every step as NaN. tb_vexp_k: x / ln 2 rounded to
   nearest in each lane; tb_vexp_poly: e^r 2^-k for the lanes' k of x. */
TB_FN tb_vf tb_vexp_k(tb_vf x) {
    return (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
}

TB_FN tb_vf tb_vexp_poly(tb_vf x, tb_vf k) {
    tb_vf r = TB_VFMA(k, TB_VBC(-0.693359375f), x), p;
    r = TB_VFMA(k, TB_VBC(2.12194440e-4f), r);
    p = TB_VBC(1.9875691500e-4f);
    p = TB_VFMA(p, r, TB_VBC(1.3981999507e-3f));
    p = TB_VFMA(p, r, TB_VBC(8.3334519073e-3f));
    p = TB_VFMA(p, r, TB_VBC(4.1665795894e-2f));
    p = TB_VFMA(p, r, TB_VBC(1.6666665459e-1f));
    p = TB_VFMA(p, r, TB_VBC(5.0000001201e-1f));
    return TB_VFMA(p, r * r, r + 1.0f);
}

TB_FN tb_vf tb_vexp_all(tb_vf x) {
#ifdef TB_VSCALEF
    tb_vf xc = TB_VSEL(x, TB_VBC(-104.0f), x < -104.0f), k, p;
#else
    tb_vf xc = TB_VSEL(x, TB_VBC(0.0f), x != x), k, p;
    tb_vi ki, k1;
    xc = TB_VSEL(xc, TB_VBC(-104.0f), xc < -104.0f);
#endif
    xc = TB_VSEL(xc, TB_VBC(89.0f), xc > 89.0f);
    k = tb_vexp_k(xc);
    p = tb_vexp_poly(xc, k);
#ifdef TB_VSCALEF
    return TB_VSCALEF(p, k);
#else
    ki = TB_VCVTI(k);
    k1 = ki >> 1; /* 2^k as two factors: denormal results are reached too */
    p = p * TB_VASF((k1 + 127) << 23) * TB_VASF((ki - k1 + 127) << 23);
    p = TB_VSEL(p, TB_VBC(INFINITY), x > 88.72283935546875f);
    p = TB_VSEL(p, TB_VBC(0.0f), x < -103.97208404541015625f);
    return TB_VSEL(p, x, x != x);
#endif
}

/* Without TB_VSCALEF, where the dialect can ask whether any lane of a mask is set (TB_VANY):
   lanes all in [-87, 88] (no NaN) have k in [-126, 127] and a normal result, so one factor
   2^k scales them to the same bits as the two factors of tb_vexp_all, with none of its
   clamps and selects; the others go through tb_vexp_all. A softmax's x - max is in (-87, 0]
   but for masked lanes: its 4096 x 4096 rows with AVX2 code, 7.6 -> 4.8 ms. */
TB_FN tb_vf tb_vexp(tb_vf x) {
#if defined(TB_VANY) && !defined(TB_VSCALEF)
    tb_vf k;
    if (TB_VANY(~((x >= -87.0f) & (x <= 88.0f)))) return tb_vexp_all(x);
    k = tb_vexp_k(x);
    return tb_vexp_poly(x, k) * TB_VASF((TB_VCVTI(k) + 127) << 23);
#else
    return tb_vexp_all(x);
#endif
}

/* The greater (smaller) lane of two, NaN when either is NaN (as the scalar ops). */
TB_FN tb_vf tb_vmax(tb_vf a, tb_vf b) {
    return TB_VSEL(b, a, (a > b) | (a != a));
}

TB_FN tb_vf tb_vmin(tb_vf a, tb_vf b) {
    return TB_VSEL(b, a, (a < b) | (a != a));
}

TB_FN tb_vf tb_vrelu(tb_vf a) {
    return TB_VSEL(a, TB_VBC(0.0f), a < 0.0f);
}

TB_FN tb_vf tb_vabs(tb_vf a) {
    return TB_VASF(TB_VASI(a) & 0x7fffffff);
}

/* erf and gelu of each lane, as tb_erf_f32 and tb_gelu_f32 (exp through TB_VEXP). */
#define TB_VMA(a, b, c) TB_VFMA((a), (b), TB_VBC(c))
TB_FN tb_vf tb_verfc_mid(tb_vf a) {
    tb_vf c = TB_VSEL(a, TB_VBC(4.0f), a > 4.0f);
    c = TB_VSEL(c, TB_VBC(1.0f), c < 1.0f);
    return TB_VEXP(-(c * c)) * TB_ERF_S(TB_VBC(1.0f) / c, TB_VMA, TB_VBC);
}

TB_FN tb_vf tb_verf(tb_vf x) {
    tb_vf a = tb_vabs(x), big = TB_VBC(1.0f) - tb_verfc_mid(a);
    big = TB_VSEL(big, -big, x < 0.0f);
    big = TB_VSEL(big, x + x * TB_ERF_R(x * x, TB_VMA, TB_VBC), a < 1.0f);
    return TB_VSEL(big, x, x != x);
}

TB_FN tb_vf tb_vgelu(tb_vf x) {
    tb_vf z = x * 0.707106769f, a = tb_vabs(z), c = tb_verfc_mid(a);
    tb_vf s = TB_VSEL(TB_VBC(2.0f) - c, TB_VSEL(c, TB_VBC(0.0f), a > 4.0f), z < 0.0f);
    s = TB_VSEL(s, TB_VBC(1.0f) + (z + z * TB_ERF_R(z * z, TB_VMA, TB_VBC)), a < 1.0f);
    return 0.5f * x * s;
}

/* sigmoid of each lane, as the scalar code: exp of -|x| only, then 1 / (1 + e) where x's sign
   bit is clear and e / (1 + e) where it is set (-0 gives 0.5 either way, NaN stays NaN). */
TB_FN tb_vf tb_vsigmoid(tb_vf x) {
    tb_vf e = TB_VEXP(-tb_vabs(x));
    return TB_VSEL(e, TB_VBC(1.0f), TB_VASI(x) >= 0) / (1.0f + e);
}

/* tanh of each lane (Cephes' tanhf, within 2 ulp): an odd polynomial where |x| < 0.625,
   elsewhere 1 - 2 / (e^2|x| + 1) with x's sign (1 where e^2|x| overflows); -0 stays -0, NaN
   NaN. The test on |x| compares bits: no float compare of a widened 16-bit value. */
TB_FN tb_vf tb_vtanh(tb_vf x) {
    tb_vf a = tb_vabs(x), z = x * x, p, r;
    p = TB_VMA(TB_VBC(-5.70498872745e-3f), z, 2.06390887954e-2f);
    p = TB_VMA(p, z, -5.37397155531e-2f);
    p = TB_VMA(p, z, 1.33314422036e-1f);
    p = TB_VMA(p, z, -3.33332819422e-1f);
    r = TB_VSEL(TB_VBC(1.0f) - TB_VBC(2.0f) / (TB_VEXP(a + a) + 1.0f), TB_VFMA(p * z, a, a),
                TB_VASI(a) < 0x3f200000);
    return TB_VASF(TB_VASI(r) | (TB_VASI(x) & ~0x7fffffff)); /* x's sign */
}

/* log of each lane (Cephes' logf, about 1 ulp): x = m 2^e with m in [sqrt(1/2), sqrt(2)),
   log(m) by a polynomial of m - 1, e ln 2 added in two parts; denormals scaled by 2^23 first.
   log(+-0) is -inf, below 0 NaN, log(inf) inf, NaN stays NaN. The special lanes are found by
   their bits: no float compare of a widened 16-bit value. */
TB_FN tb_vf tb_vlog(tb_vf x) {
    tb_vi bits = TB_VASI(x), ax = bits & 0x7fffffff, sub = bits < 0x00800000, b, e, lo;
    tb_vf m, z, p, fe, r;
    b = TB_VASI(TB_VSEL(x, x * 8388608.0f, sub));
    e = ((b >> 23) & 0xff) - 126 - (sub & 23);
    m = TB_VASF((b & 0x007fffff) | 0x3f000000); /* in [0.5, 1) */
    lo = m < 0.707106781f;
    fe = TB_VCVTF(e + lo); /* lo is -1 where set */
    m = m + TB_VSEL(TB_VBC(0.0f), m, lo) - 1.0f;
    z = m * m;
    p = TB_VMA(TB_VBC(7.0376836292e-2f), m, -1.1514610310e-1f);
    p = TB_VMA(p, m, 1.1676998740e-1f);
    p = TB_VMA(p, m, -1.2420140846e-1f);
    p = TB_VMA(p, m, 1.4249322787e-1f);
    p = TB_VMA(p, m, -1.6668057665e-1f);
    p = TB_VMA(p, m, 2.0000714765e-1f);
    p = TB_VMA(p, m, -2.4999993993e-1f);
    p = TB_VMA(p, m, 3.3333331174e-1f);
    p = TB_VFMA(fe, TB_VBC(-2.12194440e-4f), p * m * z);
    p = TB_VFMA(z, TB_VBC(-0.5f), p);
    r = TB_VFMA(fe, TB_VBC(0.693359375f), m + p);
    r = TB_VSEL(r, x, ax >= 0x7f800000); /* inf, NaN */
    r = TB_VSEL(r, TB_VBC(NAN), (bits < 0) & (ax != 0));
    return TB_VSEL(r, TB_VBC(-INFINITY), ax == 0);
}

/* softplus of each lane, as the scalar code's log1p(exp(x)) (x itself above 20): max(x, 0) +
   log1p(e) with e = exp(-|x|) in (0, 1], log1p(e) as log(1 + e) e / ((1 + e) - 1), which
   cancels the rounding of 1 + e (e itself where 1 + e rounds to 1). -inf gives 0, inf inf,
   NaN NaN. */
TB_FN tb_vf tb_vsoftplus(tb_vf x) {
    tb_vf e = TB_VEXP(-tb_vabs(x)), u = 1.0f + e;
    tb_vf l = TB_VSEL(TB_VLOG(u) * (e / (u - 1.0f)), e, TB_VASI(u) == 0x3f800000);
    return TB_VSEL(tb_vrelu(x) + l, x, TB_VASI(x) > 0x41a00000); /* x > 20 */
}

/* mish of each lane, as tb_mish_f32: x n / (n + 2) with n = e (e + 2), e = exp(x) (tanh of
   log(1 + e)), x itself above 20, (x exp(x + 40)) e^-40 below -80 (where e would lose its
   bits in the denormals). -inf gives NaN (-inf * 0, as the reference), NaN NaN. */
TB_FN tb_vf tb_vmish(tb_vf x) {
    tb_vi bits = TB_VASI(x), big = bits > 0x41a00000; /* x > 20, NaN with its sign bit clear */
    tb_vi low = (bits < 0) & (bits > -0x3d600000);  /* x < -80: the bits of -80 as an int */
    tb_vf e = TB_VEXP(TB_VSEL(TB_VSEL(x, TB_VBC(20.0f), big), x + 40.0f, low));
    tb_vf n = e * (e + 2.0f);
    tb_vf r = TB_VSEL(x * (n / (n + 2.0f)), (x * e) * 4.24835426e-18f, low);
    return TB_VSEL(r, x, big);
}

/* Whether any lane of the mask m is set. */
TB_FN int tb_vany(tb_vi m) {
#if defined(TB_VANY)
    return TB_VANY(m);
#elif defined(__OPENCL_VERSION__)
    return any(m);
#else
    float s[TB_VW];
    tb_vf f = TB_VCVTF(m);
    int i, r = 0;
    TB_VSTORE(f, s);
    for (i = 0; i < TB_VW; i++)
        r |= s[i] != 0.0f;
    return r;
#endif
}

/* sin (c = 0) or cos (c = 1) of each lane: Cephes' sinf and cosf polynomials. |x| less j pi/4,
   j the integer part of |x| 4 / pi made even (odd ones rounded up), so in [-pi/4, pi/4] (Cody
   and Waite's reduction, pi/4 in four parts, the first three of at most 10 bits so that their
   products with j are exact for |x| <= 8192 with or without a fused multiply-add), then the
   sine or the cosine polynomial by j's second bit, the sign by its third (and x's, for sin).
   Lanes above 8192, infinities and NaNs take the dialect's scalar sin or cos (tb_vany: the
   test costs one instruction where the dialect has TB_VANY). */
TB_FN tb_vf tb_vsincos(tb_vf x, int c) {
    tb_vi ax = TB_VASI(x) & 0x7fffffff, big = ax > 0x46000000, j; /* |x| > 8192 or NaN */
    tb_vf a = TB_VSEL(TB_VASF(ax), TB_VBC(0.0f), big), y, z, ps, pc, r;
    tb_vu sg;
    j = TB_VCVTI(a * 1.27323954473516f);
    j = (j + 1) & ~1;
    y = TB_VCVTF(j);
    a = TB_VFMA(y, TB_VBC(-0.78515625f), a);
    a = TB_VFMA(y, TB_VBC(-2.4175643920898437500e-4f), a);
    a = TB_VFMA(y, TB_VBC(-1.5692785382270812988e-7f), a);
    a = TB_VFMA(y, TB_VBC(-3.0385503141383551905e-11f), a);
    z = a * a;
    pc = TB_VMA(TB_VBC(2.443315711809948e-5f), z, -1.388731625493765e-3f);
    pc = TB_VMA(pc, z, 4.166664568298827e-2f);
    pc = TB_VFMA(pc * z, z, TB_VFMA(z, TB_VBC(-0.5f), TB_VBC(1.0f)));
    ps = TB_VMA(TB_VBC(-1.9515295891e-4f), z, 8.3321608736e-3f);
    ps = TB_VMA(ps, z, -1.6666654611e-1f);
    ps = TB_VFMA(ps * z, a, a);
    if (c) {
        r = TB_VSEL(pc, ps, (j & 2) != 0);
        sg = TB_VASU((j & 4) ^ ((j & 2) << 1)) << 29;
    } else {
        r = TB_VSEL(ps, pc, (j & 2) != 0);
        sg = (TB_VASU(j & 4) << 29) ^ (TB_VASU(x) & 0x80000000u);
    }
    r = TB_VASFU(TB_VASU(r) ^ sg);
    if (tb_vany(big)) {
        float xs[TB_VW], rs[TB_VW];
        int l;
        TB_VSTORE(x, xs);
        TB_VSTORE(r, rs);
        for (l = 0; l < TB_VW; l++)
            if (!(fabs(xs[l]) <= 8192.0f)) rs[l] = (float)(c ? cos(xs[l]) : sin(xs[l]));
        r = TB_VLD(0, rs);
    }
    return r;
}

/* Each lane rounded to the nearest bf16 value, as tb_rnd_bf16 (the dialect loads and stores
   16-bit floats: TB_VLDH, TB_VSTH and TB_VRNDH for f16, TB_VLDBF and TB_VSTBF for bf16). */
TB_FN tb_vf tb_vrnd_bf16(tb_vf x) {
    tb_vu u = TB_VASU(x); /* unsigned: a NaN's bits wrap, and its lane is replaced */
    tb_vf r = TB_VASFU((u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u);
    return TB_VSEL(r, TB_VASFU((u & 0xffff0000u) | 0x400000u), x != x);
}

/* Sum, maximum, minimum and product of the lanes, in halves (a fixed order; a dialect may
   fold them in registers in the same order: TB_HAS_HFOLD). */
#ifndef TB_HAS_HFOLD
TB_FN float tb_hsum(tb_vf v) {
    float s[TB_VW];
    int i, h;
    TB_VSTORE(v, s);
    for (h = TB_VW / 2; h >= 1; h >>= 1)
        for (i = 0; i < h; i++)
            s[i] = s[i] + s[i + h];
    return s[0];
}

TB_FN float tb_hprod(tb_vf v) {
    float s[TB_VW];
    int i, h;
    TB_VSTORE(v, s);
    for (h = TB_VW / 2; h >= 1; h >>= 1)
        for (i = 0; i < h; i++)
            s[i] = s[i] * s[i + h];
    return s[0];
}

TB_FN float tb_hmax(tb_vf v) {
    float s[TB_VW];
    int i, h;
    TB_VSTORE(v, s);
    for (h = TB_VW / 2; h >= 1; h >>= 1)
        for (i = 0; i < h; i++)
            s[i] = (s[i + h] > s[i] || isnan(s[i + h])) && !isnan(s[i]) ? s[i + h] : s[i];
    return s[0];
}

TB_FN float tb_hmin(tb_vf v) {
    float s[TB_VW];
    int i, h;
    TB_VSTORE(v, s);
    for (h = TB_VW / 2; h >= 1; h >>= 1)
        for (i = 0; i < h; i++)
            s[i] = (s[i + h] < s[i] || isnan(s[i + h])) && !isnan(s[i]) ? s[i + h] : s[i];
    return s[0];
}
#endif
#endif
