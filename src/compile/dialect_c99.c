/* ===========================================================================================
   The C99 dialect of the code generator, for the native backend (native.c): the head every
   program starts with (GNU vector extensions for the vector types, the CPU's own instructions
   where the compiler targets them), the math names, and a kernel's two functions (the body of
   one work item, and the entry that runs a range of work items on one thread).
   =========================================================================================== */
#include "../impl_begin.h"

#if defined(TB__HAVE_COMPILED_BACKENDS)

/* ---- the C99 dialect of the code generator ---- */

static const char tb__c99_head[] =
    "/* torch_backend.h: C99 (GNU vector extensions) for the native backend */\n"
    "#include <stdint.h>\n"
    "#include <string.h>\n"
    "#include <limits.h>\n"
    "#include <tgmath.h>\n"
    "typedef unsigned char uchar;\n"
    "typedef uint32_t uint;\n"
    "typedef uint64_t ulong;\n"
    "#define TB_FN static inline\n"
    "#define TB_EXPORT __attribute__((visibility(\"default\"))) /* whatever the flags say */\n"
    "#define TB_HAS_F64 1\n"
    "static inline long tb_min_l(long a, long b) { return a < b ? a : b; }\n"
    "static inline float tb_as_f32(uint b) { float f; memcpy(&f, &b, sizeof f); return f; }\n"
    "static inline uint tb_as_u32(float f) { uint b; memcpy(&b, &f, sizeof b); return b; }\n"
    "typedef unsigned short ushort;\n"
    "#define TB_BITS_F32(b) tb_as_f32(b)\n"
    "#define TB_F32_BITS(f) tb_as_u32(f)\n"
    "#define TB_LDH(p, i) tb_h2f((p)[i])\n"
    "#define TB_STH(p, i, v) ((p)[i] = (ushort)tb_f2h(v))\n"
    "#if defined(__FLT16_MAX__) /* the compiler's _Float16: F16C instructions where the CPU has "
    "them */\n"
    "#define TB_HAS_F16_CVT 1\n"
    "static inline uint tb_f2h(float x) {\n"
    "    _Float16 f = (_Float16)x; ushort b; memcpy(&b, &f, sizeof b); return b;\n"
    "}\n"
    "static inline float tb_rnd_f16(float x) { return (float)(_Float16)x; }\n"
    "#endif\n"
    "static inline double tb_as_f64(ulong b) { double f; memcpy(&f, &b, sizeof f); return f; }\n"
    /* OpenCL's vector names: N lanes of a type, vloadN and vstoreN (overloaded on the
       pointer's type, as OpenCL's are) */
    "#define TB_VTYPES(T, N) typedef T T##N __attribute__((vector_size(N * sizeof(T))));\n"
    "#define TB_VMOVES(T, N)                                                          \\\n"
    "    static inline T##N tb_vload_##T##N(long i, const T *p) {                    \\\n"
    "        T##N v; memcpy(&v, p + i * N, sizeof v); return v;                      \\\n"
    "    }                                                                            \\\n"
    "    static inline void tb_vstore_##T##N(T##N v, long i, T *p) {                 \\\n"
    "        memcpy(p + i * N, &v, sizeof v);                                         \\\n"
    "    }\n"
    "#define TB_VMOVE2(N)                                                                   \\\n"
    "    TB_VTYPES(float, N) TB_VTYPES(double, N) TB_VMOVES(float, N) TB_VMOVES(double, N)\n"
    "TB_VMOVE2(2) TB_VMOVE2(4) TB_VMOVE2(8) TB_VMOVE2(16)\n"
    "#define TB_VLOADN(N, i, p) \\\n"
    "    _Generic(*(p), float: tb_vload_float##N, double: tb_vload_double##N)((i), (p))\n"
    "#define TB_VSTOREN(N, v, i, p) \\\n"
    "    _Generic(*(p), float: tb_vstore_float##N, double: tb_vstore_double##N)((v), (i), (p))\n"
    "#define vload2(i, p) TB_VLOADN(2, i, p)\n"
    "#define vload4(i, p) TB_VLOADN(4, i, p)\n"
    "#define vload8(i, p) TB_VLOADN(8, i, p)\n"
    "#define vload16(i, p) TB_VLOADN(16, i, p)\n"
    "#define vstore2(v, i, p) TB_VSTOREN(2, v, i, p)\n"
    "#define vstore4(v, i, p) TB_VSTOREN(4, v, i, p)\n"
    "#define vstore8(v, i, p) TB_VSTOREN(8, v, i, p)\n"
    "#define vstore16(v, i, p) TB_VSTOREN(16, v, i, p)\n"
    "TB_VTYPES(int, 4) TB_VTYPES(int, 8) TB_VTYPES(int, 16)\n"
    "TB_VTYPES(uint, 4) TB_VTYPES(uint, 8) TB_VTYPES(uint, 16)\n"
    "TB_VTYPES(ushort, 4) TB_VTYPES(ushort, 8) TB_VTYPES(ushort, 16)\n"
    /* the row vectors: TB_VW lanes (the program's first line), the width of the registers */
    "#define TB_CAT(a, b) a##b\n"
    "#define TB_XCAT(a, b) TB_CAT(a, b)\n"
    "#define TB_VN(name) TB_XCAT(name, TB_VW)\n"
    "typedef TB_VN(float) tb_vf;\n"
    "typedef TB_VN(int) tb_vi;\n"
    "typedef TB_VN(uint) tb_vu;\n"
    "typedef TB_VN(ushort) tb_vus;\n"
    "#define TB_HAS_VEC 1\n"
    "#define TB_VLD(i, p) TB_VN(vload)((i), (p))\n"
    "#define TB_VST(v, i, p) TB_VN(vstore)((v), (i), (p))\n"
    "#define TB_VBC(c) ((tb_vf){0} + (c))\n"
    /* a * b + c where speed comes first (the matmul's products): the FMA above */
    "#define TB_VMAD(a, b, c) TB_VFMA(a, b, c)\n"
    /* a value in every lane, with no arithmetic (a broadcast the compiler folds into the
       instruction that reads it: an FMA's embedded broadcast of a load) */
    "#if TB_VW == 16\n"
    "#define TB_VSPLAT(c) ((tb_vf){(c), (c), (c), (c), (c), (c), (c), (c), (c), (c), (c), (c), "
    "(c), (c), (c), (c)})\n"
    "#elif TB_VW == 8\n"
    "#define TB_VSPLAT(c) ((tb_vf){(c), (c), (c), (c), (c), (c), (c), (c)})\n"
    "#else\n"
    "#define TB_VSPLAT(c) ((tb_vf){(c), (c), (c), (c)})\n"
    "#endif\n"
    "#define TB_VSEL(a, b, m) ((tb_vf)(((tb_vi)(a) & ~(m)) | ((tb_vi)(b) & (m))))\n"
    "#define TB_VCVTI(x) __builtin_convertvector((x), tb_vi)\n"
    "#define TB_VASF(x) ((tb_vf)(x))\n"
    "#define TB_VASI(x) ((tb_vi)(x))\n"
    "#define TB_VASU(x) ((tb_vu)(x))\n"
    "#define TB_VASFU(x) ((tb_vf)(x))\n"
    "#define TB_VSTORE(v, s) memcpy((s), &(v), sizeof(tb_vf))\n"
    "#define TB_VEXP(x) tb_vexp(x) /* the prelude's: C has no vector exp */\n"
    "static inline tb_vf TB_VSQRT(tb_vf x) {\n"
    "    tb_vf r; int i; for (i = 0; i < TB_VW; i++) r[i] = __builtin_sqrtf(x[i]); return r;\n"
    "}\n";

/* The head's second part: the CPU's own instructions for what C's operators do not say. */
static const char tb__c99_head2[] =
    "#define TB_VCVTF(x) __builtin_convertvector((x), tb_vf)\n"
    "#define TB_VLOG(x) tb_vlog(x) /* the prelude's, as TB_VEXP */\n"
    /* a window's extremes: a select the compiler keeps free of branches (their outcome is
       data, which a branch predictor cannot learn); NaN is kept apart by the caller */
    "#if defined(__has_builtin)\n"
    "#if __has_builtin(__builtin_expect_with_probability)\n"
    "#define TB_UNPRED(c) __builtin_expect_with_probability((c), 1, 0.5)\n"
    "#endif\n"
    "#elif !defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 9\n"
    "#define TB_UNPRED(c) __builtin_expect_with_probability((c), 1, 0.5)\n"
    "#endif\n"
    "#if !defined(TB_UNPRED)\n"
    "#define TB_UNPRED(c) (c)\n"
    "#endif\n"
    "#define TB_MAXS(a, b) (TB_UNPRED((a) > (b)) ? (a) : (b))\n"
    "#define TB_MINS(a, b) (TB_UNPRED((a) < (b)) ? (a) : (b))\n"
    /* a * b + c rounded once where the target has it (else two roundings); the compiler's
       x86 builtins where it still has them (TB_HB), its generic ones where it has those */
    "#if defined(__has_builtin)\n"
    "#define TB_HB(x) __has_builtin(x)\n"
    "#else\n"
    "#define TB_HB(x) 1\n"
    "#endif\n"
    "#if TB_VW == 16 && defined(__AVX512F__) && defined(__GNUC__)\n"
    "#define TB_VFMA(a, b, c) __builtin_ia32_vfmaddps512_mask(a, b, c, (unsigned short)0xffff, 4)\n"
    "#elif TB_VW == 8 && defined(__FMA__) && defined(__GNUC__) && "
    "TB_HB(__builtin_ia32_vfmaddps256)\n"
    "#define TB_VFMA(a, b, c) __builtin_ia32_vfmaddps256(a, b, c)\n"
    "#elif TB_VW == 4 && defined(__FMA__) && defined(__GNUC__) && TB_HB(__builtin_ia32_vfmaddps)\n"
    "#define TB_VFMA(a, b, c) __builtin_ia32_vfmaddps(a, b, c)\n"
    "#elif defined(__FMA__) && defined(__clang__) && TB_HB(__builtin_elementwise_fma)\n"
    "#define TB_VFMA(a, b, c) __builtin_elementwise_fma(a, b, c)\n"
    "#elif defined(__aarch64__) /* fmla, lane by lane as the compiler vectorises it */\n"
    "static inline tb_vf TB_VFMA(tb_vf a, tb_vf b, tb_vf c) {\n"
    "    tb_vf r; int i; for (i = 0; i < TB_VW; i++) r[i] = __builtin_fmaf(a[i], b[i], c[i]);\n"
    "    return r;\n"
    "}\n"
    "#else\n"
    "#define TB_VFMA(a, b, c) ((a) * (b) + (c))\n"
    "#endif\n"
    "#if TB_VW == 16 && defined(__AVX512F__) && defined(__GNUC__) /* p * 2^k rounded once */\n"
    "#define TB_VSCALEF(p, k) __builtin_ia32_scalefps512_mask(p, k, p, (unsigned short)0xffff, 4)\n"
    "#endif\n"
    "#if TB_VW == 16 && defined(__AVX512F__) && defined(__GNUC__) && "
    "TB_HB(__builtin_ia32_ptestmd512) /* whether any lane of m is set */\n"
    "#define TB_VANY(m) (__builtin_ia32_ptestmd512((m), (m), (unsigned short)0xffff) != 0)\n"
    "#elif TB_VW == 8 && defined(__AVX__) && defined(__GNUC__)\n"
    "#define TB_VANY(m) (__builtin_ia32_movmskps256((tb_vf)(m)) != 0)\n"
    "#elif TB_VW == 4 && defined(__SSE__) && defined(__GNUC__)\n"
    "#define TB_VANY(m) (__builtin_ia32_movmskps((tb_vf)(m)) != 0)\n"
    "#endif\n"
    "/* rows streamed through the caches: the next row fetched ahead, outputs stored past the\n"
    "   caches (the fence orders those stores before the kernel's end) */\n"
    "#define TB_PREFETCH(p) __builtin_prefetch(p)\n"
    "#define TB_PREFETCH_L2(p) __builtin_prefetch((p), 0, 1) /* to the outer caches only */\n"
    "#if defined(__clang__)\n"
    "#define TB_VSTREAM(v, p) __builtin_nontemporal_store((v), (tb_vf *)(p))\n"
    "#elif TB_VW == 16 && defined(__AVX512F__) && defined(__GNUC__)\n"
    "#define TB_VSTREAM(v, p) __builtin_ia32_movntps512((p), (v))\n"
    "#elif TB_VW == 8 && defined(__AVX__) && defined(__GNUC__)\n"
    "#define TB_VSTREAM(v, p) __builtin_ia32_movntps256((p), (v))\n"
    "#elif TB_VW == 4 && defined(__SSE__) && defined(__GNUC__)\n"
    "#define TB_VSTREAM(v, p) __builtin_ia32_movntps((p), (v))\n"
    "#else\n"
    "#define TB_VSTREAM(v, p) TB_VST((v), 0, (p))\n"
    "#endif\n"
    "#if defined(__SSE__) && defined(__GNUC__)\n"
    "#define TB_VSTREAM_END() __builtin_ia32_sfence()\n"
    "#else\n"
    "#define TB_VSTREAM_END() ((void)0)\n"
    "#endif\n"
    "\n";

/* The head's third part: the lanes of a row vector folded in halves in registers, in the
   prelude's order: a row's sum, product, maximum (NaN first) or minimum (tb_hsum, ...); and
   TB_SHUF(a, b, intN, lanes...), two vectors of N lanes shuffled into one (the dialect's
   `shuffle`: the packs' transposes of blocks of lanes), by gcc's older builtin where the
   compiler has no __builtin_shufflevector. */
static const char tb__c99_head_fold[] =
    /* halves by a shuffle where the compiler has one (a copy through memory would keep the
       vector, and the loop's accumulator it comes from, in memory) */
    "#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12)\n"
    "#define TB_LO16(v) __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7)\n"
    "#define TB_HI16(v) __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15)\n"
    "#define TB_LO8(v) __builtin_shufflevector(v, v, 0, 1, 2, 3)\n"
    "#define TB_HI8(v) __builtin_shufflevector(v, v, 4, 5, 6, 7)\n"
    "#define TB_LO4(v) __builtin_shufflevector(v, v, 0, 1)\n"
    "#define TB_HI4(v) __builtin_shufflevector(v, v, 2, 3)\n"
    "#define TB_SHUF(a, b, M, ...) __builtin_shufflevector(a, b, __VA_ARGS__)\n"
    "#define TB_HALVES(T, N, H)                                                          \\\n"
    "    static inline T##H tb_lo_##T##N(T##N v) { return TB_LO##N(v); }                \\\n"
    "    static inline T##H tb_hi_##T##N(T##N v) { return TB_HI##N(v); }\n"
    "#else\n"
    "#define TB_SHUF(a, b, M, ...) __builtin_shuffle(a, b, (M){__VA_ARGS__})\n"
    "#define TB_HALVES(T, N, H)                                                          \\\n"
    "    static inline T##H tb_lo_##T##N(T##N v) { T##H r; memcpy(&r, &v, sizeof r); return r; } "
    "\\\n"
    "    static inline T##H tb_hi_##T##N(T##N v) {                                      \\\n"
    "        T##H r; memcpy(&r, (char *)&v + sizeof r, sizeof r); return r;              \\\n"
    "    }\n"
    "#endif\n"
    "#define TB_FOLDOP(T, IT)                                                            \\\n"
    "    static inline T tb_fold_##T(T a, T b, int op) {                                \\\n"
    "        IT m;                                                                       \\\n"
    "        if (op == 0) return a + b;                                                  \\\n"
    "        if (op == 1) return a * b;                                                  \\\n"
    "        m = (op == 2 ? b > a : b < a) | (b != b);                                   \\\n"
    "        m &= ~(a != a);                                                             \\\n"
    "        return (T)(((IT)a & ~m) | ((IT)b & m));                                     \\\n"
    "    }\n"
    "TB_VTYPES(int, 2) TB_HALVES(float, 16, 8) TB_HALVES(float, 8, 4) TB_HALVES(float, 4, 2)\n"
    "TB_FOLDOP(float8, int8) TB_FOLDOP(float4, int4) TB_FOLDOP(float2, int2)\n"
    "static inline float tb_hfold(tb_vf v, int op) {\n"
    "    float a, b;\n"
    "#if TB_VW == 16\n"
    "    float8 v8 = tb_fold_float8(tb_lo_float16(v), tb_hi_float16(v), op);\n"
    "#elif TB_VW == 8\n"
    "    float8 v8 = v;\n"
    "#endif\n"
    "#if TB_VW >= 8\n"
    "    float4 v4 = tb_fold_float4(tb_lo_float8(v8), tb_hi_float8(v8), op);\n"
    "#else\n"
    "    float4 v4 = v;\n"
    "#endif\n"
    "    float2 v2 = tb_fold_float2(tb_lo_float4(v4), tb_hi_float4(v4), op);\n"
    "    a = v2[0], b = v2[1];\n"
    "    if (op == 0) return a + b;\n"
    "    if (op == 1) return a * b;\n"
    "    return ((op == 2 ? b > a : b < a) || b != b) && a == a ? b : a;\n"
    "}\n"
    "#define TB_HAS_HFOLD 1\n"
    "#define tb_hsum(v) tb_hfold((v), 0)\n"
    "#define tb_hprod(v) tb_hfold((v), 1)\n"
    "#define tb_hmax(v) tb_hfold((v), 2)\n"
    "#define tb_hmin(v) tb_hfold((v), 3)\n"
    "\n";

/* The head's fourth part: TB_VW lanes of 16-bit floats. */
static const char tb__c99_head3[] =
    /* f16: the CPU's conversions where the target has them (AVX-512, F16C), else lane by
       lane; bf16 as the top half of an f32 */
    "#if TB_VW == 16 && defined(__AVX512F__) && defined(__GNUC__)\n"
    "typedef short tb_vhi __attribute__((vector_size(32)));\n"
    "static inline tb_vf tb_vh2f(tb_vhi h) {\n"
    "    return __builtin_ia32_vcvtph2ps512_mask(h, (tb_vf){0}, (unsigned short)0xffff, 4);\n"
    "}\n"
    "static inline tb_vhi tb_vf2h(tb_vf v) {\n"
    "    return __builtin_ia32_vcvtps2ph512_mask(v, 0, (tb_vhi){0}, (unsigned short)0xffff);\n"
    "}\n"
    "#if !defined(__clang__) /* gcc's builtin: one widening load (clang has no such builtin) */\n"
    "#define TB_HAS_VLDBF 1\n"
    "static inline tb_vf tb_vldbf(const ushort *p) {\n"
    "    tb_vhi h; memcpy(&h, p, sizeof h);\n"
    "    return (tb_vf)(__builtin_ia32_pmovzxwd512_mask(h, (tb_vi){0}, (unsigned short)0xffff) "
    "<< 16);\n"
    "}\n"
    "#endif\n"
    "#elif TB_VW == 8 && defined(__F16C__) && defined(__GNUC__) && "
    "TB_HB(__builtin_ia32_vcvtph2ps256)\n"
    "typedef short tb_vhi __attribute__((vector_size(16)));\n"
    "static inline tb_vf tb_vh2f(tb_vhi h) { return __builtin_ia32_vcvtph2ps256(h); }\n"
    "static inline tb_vhi tb_vf2h(tb_vf v) { return __builtin_ia32_vcvtps2ph256(v, 0); }\n"
    "#elif TB_VW == 4 && defined(__F16C__) && defined(__GNUC__) && "
    "TB_HB(__builtin_ia32_vcvtph2ps)\n"
    "typedef short tb_vhi __attribute__((vector_size(8)));\n"
    "typedef short tb_v8hi __attribute__((vector_size(16)));\n"
    "static inline tb_vf tb_vh2f(tb_vhi h) {\n"
    "    tb_v8hi w = {0}; memcpy(&w, &h, sizeof h); return __builtin_ia32_vcvtph2ps(w);\n"
    "}\n"
    "static inline tb_vhi tb_vf2h(tb_vf v) {\n"
    "    tb_v8hi w = __builtin_ia32_vcvtps2ph(v, 0); tb_vhi h; memcpy(&h, &w, sizeof h);\n"
    "    return h;\n"
    "}\n"
    "#elif TB_VW == 16 && defined(__F16C__) && defined(__GNUC__) && "
    "TB_HB(__builtin_ia32_vcvtph2ps256)\n"
    "typedef short tb_vhi __attribute__((vector_size(32)));\n"
    "typedef short tb_v8hi __attribute__((vector_size(16)));\n"
    "static inline tb_vf tb_vh2f(tb_vhi h) {\n"
    "    tb_v8hi a, b; float8 fa, fb; tb_vf r;\n"
    "    memcpy(&a, &h, 16); memcpy(&b, (char *)&h + 16, 16);\n"
    "    fa = __builtin_ia32_vcvtph2ps256(a); fb = __builtin_ia32_vcvtph2ps256(b);\n"
    "    memcpy(&r, &fa, 32); memcpy((char *)&r + 32, &fb, 32); return r;\n"
    "}\n"
    "static inline tb_vhi tb_vf2h(tb_vf v) {\n"
    "    float8 fa, fb; tb_v8hi a, b; tb_vhi h;\n"
    "    memcpy(&fa, &v, 32); memcpy(&fb, (char *)&v + 32, 32);\n"
    "    a = __builtin_ia32_vcvtps2ph256(fa, 0); b = __builtin_ia32_vcvtps2ph256(fb, 0);\n"
    "    memcpy(&h, &a, 16); memcpy((char *)&h + 16, &b, 16); return h;\n"
    "}\n"
    "#else\n"
    "typedef tb_vus tb_vhi;\n"
    "static inline float tb_h2f(uint h);\n"
    "static inline uint tb_f2h(float f);\n"
    "static inline tb_vf tb_vh2f(tb_vhi h) {\n"
    "    tb_vf r; int i; for (i = 0; i < TB_VW; i++) r[i] = tb_h2f(h[i]); return r;\n"
    "}\n"
    "static inline tb_vhi tb_vf2h(tb_vf v) {\n"
    "    tb_vhi h; int i; for (i = 0; i < TB_VW; i++) h[i] = (ushort)tb_f2h(v[i]); return h;\n"
    "}\n"
    "#endif\n"
    "static inline tb_vf tb_vldh(const ushort *p) {\n"
    "    tb_vhi h; memcpy(&h, p, sizeof h); return tb_vh2f(h);\n"
    "}\n"
    "static inline void tb_vsth(tb_vf v, ushort *p) {\n"
    "    tb_vhi h = tb_vf2h(v); memcpy(p, &h, sizeof h);\n"
    "}\n"
    "#define TB_VLDH(p) tb_vldh(p)\n"
    "#define TB_VSTH(v, p) tb_vsth((v), (p))\n"
    "#define TB_VRNDH(x) tb_vh2f(tb_vf2h(x))\n"
    "#ifndef TB_HAS_VLDBF\n"
    "static inline tb_vf tb_vldbf(const ushort *p) {\n"
    "    tb_vus h; memcpy(&h, p, sizeof h);\n"
    "    return (tb_vf)(__builtin_convertvector(h, tb_vu) << 16);\n"
    "}\n"
    "#endif\n"
    "static inline void tb_vstbf(tb_vf r, ushort *p) {\n"
    "    tb_vus h = __builtin_convertvector((tb_vu)r >> 16, tb_vus); memcpy(p, &h, sizeof h);\n"
    "}\n"
    "#define TB_VLDBF(p) tb_vldbf(p)\n"
    "#define TB_VSTBF(v, p) tb_vstbf(tb_vrnd_bf16(v), (p))\n"
    /* W bytes (a where's condition) as 0 or 1 in each lane */
    "typedef uchar tb_vb __attribute__((vector_size(TB_VW)));\n"
    "static inline tb_vf tb_vldb(const void *p) {\n"
    "    tb_vb b; memcpy(&b, p, sizeof b); return __builtin_convertvector(b != 0, tb_vf) * -1.0f;\n"
    "}\n"
    "#define TB_VLDB(p) tb_vldb(p)\n";

static const char *tb__c99_math(const char *fn, tb_dtype dtype) {
    /* f32 exp: the prelude's (no call: loops around it vectorise); the others: <tgmath.h> picks the
     * float or double function */
    if (dtype != TB_F64 && strcmp(fn, "exp") == 0) return "tb_exp_f32";
    return fn;
}

static void tb__work_items(const size_t group_size[3], const size_t groups[3], uint64_t items,
                           uint64_t size[3]) {
    int d;
    if (group_size[0] > 0) {
        for (d = 0; d < 3; d++)
            size[d] = (uint64_t)groups[d] * (uint64_t)(group_size[d] > 0 ? group_size[d] : 1);
    } else {
        size[0] = items;
        size[1] = size[2] = 1;
    }
}

/* The work-item space of a kernel: its global size per dimension. */
static void tb__c99_global_size(const tb__plan_kernel *k, uint64_t size[3]) {
    tb__work_items(k->group_size, k->groups, k->items, size);
}

/* The declarations of a kernel's parameters, each after a comma. */
static void tb__c99_param_decls(tb__str *src, const tb__cg_param *params, size_t num_params) {
    size_t i;
    for (i = 0; i < num_params; i++) {
        const tb__cg_param *q = &params[i];
        if (q->role == TB__ARG_SCALAR) {
            tb__str_append(src, ",\n    const %s %s", q->type, q->name);
        } else if (q->role == TB__CG_ARGS) {
            tb__str_append(src, ",\n    void *const *%s", q->name);
        } else if (q->role == -1 || q->role == TB__ARG_ERR) {
            tb__str_append(src, ",\n    %s *restrict %s", q->type, q->name);
        } else {
            tb__str_append(src, ",\n    const %s *restrict %s", q->type, q->name);
        }
    }
}

/* A kernel is two functions: NAME_item, the body for one work item (tb_g0..2 its ids), and
   NAME(args, lo, hi), which runs work items [lo, hi) of the flattened space, the pointers and
   scalars it reads taken from args in the plan's order (the output first). The helpers that
   NAME_item calls come first, with the kernel's parameters in place of their tokens. */
static void tb__c99_emit_kernel(tb__str *src, const tb__plan_kernel *k, const tb__cg_param *params,
                                size_t num_params, const char *helpers, const char *body) {
    /* an elementwise kernel's non-temporal stores: one fence for the whole range */
    const char *fence =
        k->stream_out && k->kind == TB__K_ELEMENTWISE ? "    TB_VSTREAM_END();\n" : "";
    uint64_t size[3];
    size_t i;
    tb__str decls, names;
    tb__c99_global_size(k, size);
    memset(&decls, 0, sizeof decls);
    memset(&names, 0, sizeof names);
    if (helpers[0] != '\0') {
        tb__c99_param_decls(&decls, params, num_params);
        for (i = 0; i < num_params; i++)
            tb__str_append(&names, ", %s", params[i].name);
        if (decls.failed || names.failed) src->failed = true;
        tb__cg_emit_replacing(src, helpers, TB__CG_PARAMS_TOKEN,
                              decls.data != NULL ? decls.data : "");
    }
    tb__str_append(src, "static inline void %s_item(long tb_g0, long tb_g1, long tb_g2", k->name);
    tb__c99_param_decls(src, params, num_params);
    tb__str_append(src, ") {\n    (void)tb_g0, (void)tb_g1, (void)tb_g2;\n");
    tb__cg_emit_replacing(src, body, TB__CG_ARGS_TOKEN, names.data != NULL ? names.data : "");
    tb__str_append(src, "}\n\n");
    tb__str_free(&decls);
    tb__str_free(&names);
    tb__str_append(src, "TB_EXPORT void %s(void *const *tb_a, long tb_lo, long tb_hi) {\n",
                   k->name);
    for (i = 0; i < num_params; i++) {
        const tb__cg_param *q = &params[i];
        if (q->role == TB__ARG_SCALAR) {
            tb__str_append(src, "    const %s %s = *(const %s *)tb_a[%zu];\n", q->type, q->name,
                           q->type, i);
        } else if (q->role == TB__CG_ARGS) {
            tb__str_append(src, "    void *const *%s = tb_a + %zu;\n", q->name, i);
        } else if (q->role == -1 || q->role == TB__ARG_ERR) {
            tb__str_append(src, "    %s *restrict %s = (%s *)tb_a[%zu];\n", q->type, q->name,
                           q->type, i);
        } else {
            tb__str_append(src, "    const %s *restrict %s = (const %s *)tb_a[%zu];\n", q->type,
                           q->name, q->type, i);
        }
    }
    /* the bound lets the compiler see that every item is in range */
    tb__str_append(src, "    if (tb_hi > %lldL) tb_hi = %lldL;\n",
                   (long long)(size[0] * size[1] * size[2]),
                   (long long)(size[0] * size[1] * size[2]));
    /* one item per step: a single dimension, or dimension 1 fastest (tb__plan_kernel) */
    if ((size[1] == 1 || k->panels_first) && size[2] == 1) {
        char ids[96];
        if (size[1] == 1) {
            snprintf(ids, sizeof ids, "tb_w, 0, 0");
        } else {
            snprintf(ids, sizeof ids, "tb_w / %lldL, tb_w %% %lldL, 0", (long long)size[1],
                     (long long)size[1]);
        }
        tb__str_append(src, "    for (long tb_w = tb_lo; tb_w < tb_hi; tb_w++)\n");
        tb__str_append(src, "        %s_item(%s", k->name, ids);
        for (i = 0; i < num_params; i++)
            tb__str_append(src, ", %s", params[i].name);
        tb__str_append(src, ");\n%s}\n\n", fence);
        return;
    }
    /* runs of dimension 0 at fixed ids 1 and 2: one division per run, not per item */
    tb__str_append(src, "    for (long tb_w = tb_lo; tb_w < tb_hi;) {\n");
    tb__str_append(src,
                   "        const long tb_r = tb_w / %lldL, tb_g1 = tb_r %% %lldL, tb_g2 = tb_r / "
                   "%lldL;\n",
                   (long long)size[0], (long long)size[1], (long long)size[1]);
    tb__str_append(src, "        long tb_g0 = tb_w %% %lldL, tb_end = tb_w + (%lldL - tb_g0);\n",
                   (long long)size[0], (long long)size[0]);
    tb__str_append(src, "        if (tb_end > tb_hi) tb_end = tb_hi;\n");
    tb__str_append(src, "        for (; tb_w < tb_end; tb_w++, tb_g0++)\n");
    tb__str_append(src, "            %s_item(tb_g0, tb_g1, tb_g2", k->name);
    for (i = 0; i < num_params; i++)
        tb__str_append(src, ", %s", params[i].name);
    tb__str_append(src, ");\n    }\n%s}\n\n", fence);
}

static void tb__dialect_c99(tb__dialect *d, int32_t vec_width) {
    memset(d, 0, sizeof *d);
    d->vec_width = vec_width;
    d->name = "C99";
    d->head[0] = tb__c99_head;
    d->head[1] = tb__c99_head2;
    d->head[2] = tb__c99_head_fold;
    d->head[3] = tb__c99_head3;
    d->vec_make = "(%s){%s}";
    d->global = "";
    d->local = NULL; /* a thread runs a range of work items: no work-groups */
    d->barrier = "";
    d->global_id = "tb_g%d";
    d->group_id = "tb_g%d";
    d->local_id = "0";
    d->vec_zero = "(%s){0}";
    d->min_long = "tb_min_l";
    d->bits_f32 = "tb_as_f32";
    d->bits_f64 = "tb_as_f64";
    d->err_claim = "__sync_bool_compare_and_swap(tb_err, 0u, code)";
    d->constant = "static const ";
    d->f64 = true;
    d->item_loops = true;
    d->noinline = "__attribute__((noinline))";
    d->shuffle = "TB_SHUF(%s, %s, int%d, %s)";
    d->math = tb__c99_math;
    d->kernel = tb__c99_emit_kernel;
}

#endif /* TB__HAVE_COMPILED_BACKENDS */
