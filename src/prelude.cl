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
    uint x = sel == 0 ? w.x : (sel == 1 ? w.y : (sel == 2 ? w.z : w.w));
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
