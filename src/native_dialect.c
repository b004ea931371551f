/* ===========================================================================================
   The C99 dialect of the code generator, for the native backend (native.c): the head every
   program starts with (GNU vector extensions for the vector types, the CPU's own instructions
   where the compiler targets them), the math names, and a kernel's two functions (the body of
   one work item, and the entry that runs a range of work items on one thread).
   =========================================================================================== */
#include "impl_begin.h"

#if defined(TB__HAVE_NATIVE)

/* ---- the C99 dialect of the code generator ---- */

static const char tb__native_head[] =
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
    "typedef float float16 __attribute__((vector_size(64)));\n"
    "typedef double double8 __attribute__((vector_size(64)));\n"
    "static inline float16 vload16(long i, const float *p) {\n"
    "    float16 v; memcpy(&v, p + i * 16, sizeof v); return v;\n"
    "}\n"
    "static inline void vstore16(float16 v, long i, float *p) { memcpy(p + i * 16, &v, sizeof v); "
    "}\n"
    "static inline double8 vload8(long i, const double *p) {\n"
    "    double8 v; memcpy(&v, p + i * 8, sizeof v); return v;\n"
    "}\n"
    "static inline void vstore8(double8 v, long i, double *p) { memcpy(p + i * 8, &v, sizeof v); "
    "}\n"
    "typedef int int16 __attribute__((vector_size(64)));\n"
    "#define TB_HAS_VEC16 1\n"
    "#define TB_VBC(c) ((float16){0} + (c))\n"
    "#define TB_VSEL(a, b, m) ((float16)(((int16)(a) & ~(m)) | ((int16)(b) & (m))))\n"
    "#define TB_VCVTI(x) __builtin_convertvector((x), int16)\n"
    "#define TB_VASF(x) ((float16)(x))\n"
    "#define TB_VASI(x) ((int16)(x))\n"
    "typedef uint uint16 __attribute__((vector_size(64)));\n"
    "#define TB_VASU(x) ((uint16)(x))\n"
    "#define TB_VASFU(x) ((float16)(x))\n"
    "#define TB_VSTORE(v, s) memcpy((s), &(v), sizeof(float16))\n"
    "#define TB_VEXP(x) tb_vexp16(x) /* the prelude's: C has no vector exp */\n"
    "#if defined(__AVX512F__) && defined(__GNUC__) /* a * b + c rounded once */\n"
    "#define TB_VFMA(a, b, c) __builtin_ia32_vfmaddps512_mask(a, b, c, (unsigned short)0xffff, 4)\n"
    "#else\n"
    "#define TB_VFMA(a, b, c) ((a) * (b) + (c))\n"
    "#endif\n"
    "#if defined(__AVX512F__) && defined(__GNUC__) /* p * 2^k (k whole) rounded once */\n"
    "#define TB_VSCALEF(p, k) __builtin_ia32_scalefps512_mask(p, k, p, (unsigned short)0xffff, 4)\n"
    "#endif\n"
    "/* rows streamed through the caches: the next row fetched ahead, outputs stored past the\n"
    "   caches (the fence orders those stores before the kernel's end) */\n"
    "#define TB_PREFETCH(p) __builtin_prefetch(p)\n"
    "#define TB_PREFETCH_L2(p) __builtin_prefetch((p), 0, 1) /* to the outer caches only */\n"
    "#if defined(__clang__)\n"
    "#define TB_VSTREAM(v, p) __builtin_nontemporal_store((v), (float16 *)(p))\n"
    "#elif defined(__AVX512F__) && defined(__GNUC__)\n"
    "#define TB_VSTREAM(v, p) __builtin_ia32_movntps512((p), (v))\n"
    "#else\n"
    "#define TB_VSTREAM(v, p) vstore16((v), 0, (p))\n"
    "#endif\n"
    "#if defined(__SSE__) && defined(__GNUC__)\n"
    "#define TB_VSTREAM_END() __builtin_ia32_sfence()\n"
    "#else\n"
    "#define TB_VSTREAM_END() ((void)0)\n"
    "#endif\n"
    "static inline float16 TB_VSQRT(float16 x) {\n"
    "    float16 r; int i; for (i = 0; i < 16; i++) r[i] = __builtin_sqrtf(x[i]); return r;\n"
    "}\n"
    "\n";

/* The head's second part: 16 lanes of 16-bit floats. */
static const char tb__native_head2[] =
    /* 16 lanes of f16: the F16C instructions where the CPU has them, else lane by lane; bf16
       as the top half of an f32 */
    "typedef unsigned short ushort16 __attribute__((vector_size(32)));\n"
    "#if defined(__AVX512F__) && defined(__GNUC__)\n"
    "typedef short tb_v16hi __attribute__((vector_size(32)));\n"
    "static inline float16 tb_vh2f16(tb_v16hi h) {\n"
    "    return __builtin_ia32_vcvtph2ps512_mask(h, (float16){0}, (unsigned short)0xffff, 4);\n"
    "}\n"
    "static inline tb_v16hi tb_vf2h16(float16 v) {\n"
    "    return __builtin_ia32_vcvtps2ph512_mask(v, 0, (tb_v16hi){0}, (unsigned short)0xffff);\n"
    "}\n"
    "#if !defined(__clang__) /* gcc's builtin: one widening load (clang has no such builtin) */\n"
    "#define TB_HAS_VLDBF 1\n"
    "static inline float16 tb_vldbf(const ushort *p) {\n"
    "    tb_v16hi h; memcpy(&h, p, sizeof h);\n"
    "    return (float16)(__builtin_ia32_pmovzxwd512_mask(h, (int16){0}, (unsigned short)0xffff) "
    "<< 16);\n"
    "}\n"
    "#endif\n"
    "#elif defined(__F16C__) && defined(__GNUC__)\n"
    "typedef short tb_v16hi __attribute__((vector_size(32)));\n"
    "typedef short tb_v8hi __attribute__((vector_size(16)));\n"
    "typedef float tb_v8sf __attribute__((vector_size(32)));\n"
    "static inline float16 tb_vh2f16(tb_v16hi h) {\n"
    "    tb_v8hi a, b; tb_v8sf fa, fb; float16 r;\n"
    "    memcpy(&a, &h, 16); memcpy(&b, (char *)&h + 16, 16);\n"
    "    fa = __builtin_ia32_vcvtph2ps256(a); fb = __builtin_ia32_vcvtph2ps256(b);\n"
    "    memcpy(&r, &fa, 32); memcpy((char *)&r + 32, &fb, 32); return r;\n"
    "}\n"
    "static inline tb_v16hi tb_vf2h16(float16 v) {\n"
    "    tb_v8sf fa, fb; tb_v8hi a, b; tb_v16hi h;\n"
    "    memcpy(&fa, &v, 32); memcpy(&fb, (char *)&v + 32, 32);\n"
    "    a = __builtin_ia32_vcvtps2ph256(fa, 0); b = __builtin_ia32_vcvtps2ph256(fb, 0);\n"
    "    memcpy(&h, &a, 16); memcpy((char *)&h + 16, &b, 16); return h;\n"
    "}\n"
    "#else\n"
    "typedef ushort16 tb_v16hi;\n"
    "static inline float tb_h2f(uint h);\n"
    "static inline uint tb_f2h(float f);\n"
    "static inline float16 tb_vh2f16(tb_v16hi h) {\n"
    "    float16 r; int i; for (i = 0; i < 16; i++) r[i] = tb_h2f(h[i]); return r;\n"
    "}\n"
    "static inline tb_v16hi tb_vf2h16(float16 v) {\n"
    "    tb_v16hi h; int i; for (i = 0; i < 16; i++) h[i] = (ushort)tb_f2h(v[i]); return h;\n"
    "}\n"
    "#endif\n"
    "static inline float16 tb_vldh(const ushort *p) {\n"
    "    tb_v16hi h; memcpy(&h, p, sizeof h); return tb_vh2f16(h);\n"
    "}\n"
    "static inline void tb_vsth(float16 v, ushort *p) {\n"
    "    tb_v16hi h = tb_vf2h16(v); memcpy(p, &h, sizeof h);\n"
    "}\n"
    "#define TB_VLDH(p) tb_vldh(p)\n"
    "#define TB_VSTH(v, p) tb_vsth((v), (p))\n"
    "#define TB_VRNDH(x) tb_vh2f16(tb_vf2h16(x))\n"
    "#ifndef TB_HAS_VLDBF\n"
    "static inline float16 tb_vldbf(const ushort *p) {\n"
    "    ushort16 h; memcpy(&h, p, sizeof h);\n"
    "    return (float16)(__builtin_convertvector(h, uint16) << 16);\n"
    "}\n"
    "#endif\n"
    "static inline void tb_vstbf(float16 r, ushort *p) {\n"
    "    ushort16 h = __builtin_convertvector((uint16)r >> 16, ushort16); memcpy(p, &h, sizeof "
    "h);\n"
    "}\n"
    "#define TB_VLDBF(p) tb_vldbf(p)\n"
    "#define TB_VSTBF(v, p) tb_vstbf(tb_vrnd_bf16(v), (p))\n";

static const char *tb__native_math(const char *fn, tb_dtype dtype) {
    (void)dtype; /* <tgmath.h> picks the float or double function */
    return fn;
}

/* The work-item space of a kernel: its global size per dimension. */
static void tb__native_global_size(const tb__plan_kernel *k, uint64_t size[3]) {
    int d;
    if (k->group_size[0] > 0) {
        for (d = 0; d < 3; d++)
            size[d] =
                (uint64_t)k->groups[d] * (uint64_t)(k->group_size[d] > 0 ? k->group_size[d] : 1);
    } else {
        size[0] = k->items;
        size[1] = size[2] = 1;
    }
}

/* A kernel is two functions: NAME_item, the body for one work item (tb_g0..2 its ids), and
   NAME(args, lo, hi), which runs work items [lo, hi) of the flattened space, the pointers and
   scalars it reads taken from args in the plan's order (the output first). */
static void tb__native_emit_kernel(tb__str *src, const tb__plan_kernel *k,
                                   const tb__cg_param *params, size_t num_params,
                                   const char *body) {
    /* an elementwise kernel's non-temporal stores: one fence for the whole range */
    const char *fence =
        k->stream_out && k->kind == TB__K_ELEMENTWISE ? "    TB_VSTREAM_END();\n" : "";
    uint64_t size[3];
    size_t i;
    tb__native_global_size(k, size);
    tb__str_append(src, "static inline void %s_item(long tb_g0, long tb_g1, long tb_g2", k->name);
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
    tb__str_append(src, ") {\n    (void)tb_g0, (void)tb_g1, (void)tb_g2;\n%s}\n\n", body);
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
    if (size[1] == 1 && size[2] == 1) {
        tb__str_append(src, "    for (long tb_w = tb_lo; tb_w < tb_hi; tb_w++)\n");
        tb__str_append(src, "        %s_item(tb_w, 0, 0", k->name);
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

static void tb__native_dialect(tb__dialect *d) {
    memset(d, 0, sizeof *d);
    d->name = "C99";
    d->head = tb__native_head;
    d->head2 = tb__native_head2;
    d->vec_make = "(float16){%s}";
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
    d->math = tb__native_math;
    d->kernel = tb__native_emit_kernel;
}

#endif /* TB__HAVE_NATIVE */
