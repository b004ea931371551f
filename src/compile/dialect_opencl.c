/* ===========================================================================================
   The OpenCL C dialect of the code generator (the opencl backend's, and any OpenCL runtime's
   through the kit): the head every program starts with, the math names, and a kernel's
   signature with the work-group size the plan fixed.
   =========================================================================================== */
#include "../impl_begin.h"

#if defined(TB__HAVE_COMPILED_BACKENDS)

/* ---- the OpenCL C dialect of the code generator ---- */

static const char *tb__oclc_math(const char *fn, tb_dtype dtype) {
    /* OpenCL C's math functions are overloaded (the built-in exp: on PoCL faster than the
       prelude's tb_exp_f32, which the native dialect takes) */
    (void)dtype;
    return fn;
}

/* `__kernel void NAME(__global T *restrict out, ...)`, with the work-group size the plan fixed. */
static void tb__oclc_emit_kernel(tb__str *src, const tb__plan_kernel *k, const tb__cg_param *params,
                                 size_t num_params, const char *helpers, const char *body) {
    const tb__cg_param *table = NULL;
    size_t i;
    (void)helpers; /* none: the dialect has no noinline */
    tb__str_append(src, "__kernel ");
    if (k->group_size[0] > 0) {
        tb__str_append(src, "__attribute__((reqd_work_group_size(%zu, %zu, %zu))) ",
                       k->group_size[0], k->group_size[1] > 0 ? k->group_size[1] : 1,
                       k->group_size[2] > 0 ? k->group_size[2] : 1);
    }
    tb__str_append(src, "void %s(", k->name);
    for (i = 0; i < num_params; i++) {
        const tb__cg_param *q = &params[i];
        const char *sep = i == 0 ? "" : ",\n    ";
        if (q->role == TB__ARG_SCALAR) {
            tb__str_append(src, "%sconst %s %s", sep, q->type, q->name);
        } else if (q->role == -1 || q->role == TB__ARG_ERR) {
            tb__str_append(src, "%s__global %s *restrict %s", sep, q->type, q->name);
        } else if (q->role == TB__ARG_TABLE) {
            /* the whole table and where the kernel's run of it starts */
            tb__str_append(src, "%s__global const %s *restrict %s_all,\n    const long %s_at", sep,
                           q->type, q->name, q->name);
            table = q;
        } else {
            tb__str_append(src, "%s__global const %s *restrict %s", sep, q->type, q->name);
        }
    }
    tb__str_append(src, ") {\n");
    if (table != NULL)
        tb__str_append(src, "    __global const %s *restrict %s = %s_all + %s_at;\n", table->type,
                       table->name, table->name, table->name);
    tb__str_append(src, "%s}\n\n", body);
}

/* The head of an OpenCL program after its fp64 switch (the same with or without it). On x86
   without AVX-512, clang narrows a compare of a lane widened from f16 (relu's, exp's range
   tests) to a half compare, which that target runs lane by lane with a branch each: TB_VOPAQUE
   hides the widened vector from the optimiser by an empty asm (no instruction). */
#define TB__OCL_HEAD_REST                                                                          \
    "/* a * b + c stays two roundings, as in the reference, but where a kernel asks for */"        \
    "/* one (TB_VFMA, TB_VMAD: the packed matmul's products) */\n"                                 \
    "#pragma OPENCL FP_CONTRACT OFF\n"                                                             \
    "#define TB_FN\n"                                                                              \
    "#define TB_MAXS(a, b) ((a) > (b) ? (a) : (b))\n"                                              \
    "#define TB_MINS(a, b) ((a) < (b) ? (a) : (b))\n"                                              \
    "/* the row vectors: TB_VW lanes (the program's first line), built-in names by pasting */\n"   \
    "#define TB_CAT(a, b) a##b\n"                                                                  \
    "#define TB_XCAT(a, b) TB_CAT(a, b)\n"                                                         \
    "#define TB_VN(name) TB_XCAT(name, TB_VW)\n"                                                   \
    "typedef TB_VN(float) tb_vf;\n"                                                                \
    "typedef TB_VN(int) tb_vi;\n"                                                                  \
    "typedef TB_VN(uint) tb_vu;\n"                                                                 \
    "#define TB_HAS_VEC 1\n"                                                                       \
    "#define TB_VLD(i, p) TB_VN(vload)((i), (p))\n"                                                \
    "#define TB_VST(v, i, p) TB_VN(vstore)((v), (i), (p))\n"                                       \
    "#define TB_VBC(c) ((tb_vf)(c))\n"                                                             \
    "#define TB_VSPLAT(c) ((tb_vf)(c))\n"                                                          \
    "/* a * b + c where speed comes first: contracted, so fused where the device has FMA */"       \
    "/* (fma would be a software call per lane on a device without it) */\n"                       \
    "TB_FN tb_vf tb_vmad(tb_vf a, tb_vf b, tb_vf c) {\n"                                           \
    "#pragma OPENCL FP_CONTRACT ON\n"                                                              \
    "    return a * b + c;\n"                                                                      \
    "}\n"                                                                                          \
    "#define TB_VMAD(a, b, c) tb_vmad(a, b, c)\n"                                                  \
    "#define TB_VSEL(a, b, m) select((a), (b), (m))\n"                                             \
    "#define TB_VCVTI(x) TB_VN(convert_int)(x)\n"                                                  \
    "#define TB_VCVTF(x) TB_VN(convert_float)(x)\n"                                                \
    "#define TB_VASF(x) TB_VN(as_float)(x)\n"                                                      \
    "#define TB_VASI(x) TB_VN(as_int)(x)\n"                                                        \
    "#define TB_VASU(x) TB_VN(as_uint)(x)\n"                                                       \
    "#define TB_VASFU(x) TB_VN(as_float)(x)\n"                                                     \
    "#define TB_VFMA(a, b, c) fma(a, b, c)\n"                                                      \
    "#define TB_VSTORE(v, s) TB_VST((v), 0, (s))\n"                                                \
    "#define TB_VSQRT(x) sqrt(x)\n"                                                                \
    "#define TB_VEXP(x) exp(x)\n"                                                                  \
    "#define TB_VLOG(x) log(x)\n"                                                                  \
    "/* rows streamed through the caches (CPU devices): the next row fetched ahead, outputs */\n"  \
    "/* stored past the caches, the fence that orders those stores before the kernel's end */\n"   \
    "#if defined(__clang__)\n"                                                                     \
    "#define TB_PREFETCH(p) __builtin_prefetch(p)\n"                                               \
    "#define TB_PREFETCH_L2(p) __builtin_prefetch((p), 0, 1)\n"                                    \
    "#define TB_VSTREAM(v, p) __builtin_nontemporal_store((v), (__global tb_vf *)(p))\n"           \
    "#else\n"                                                                                      \
    "#define TB_PREFETCH(p) prefetch((p), 1)\n"                                                    \
    "#define TB_PREFETCH_L2(p) prefetch((p), 1)\n"                                                 \
    "#define TB_VSTREAM(v, p) TB_VST((v), 0, (p))\n"                                               \
    "#endif\n"                                                                                     \
    "#if defined(__clang__) && defined(__SSE__)\n"                                                 \
    "#define TB_VSTREAM_END() __builtin_ia32_sfence()\n"                                           \
    "#else\n"                                                                                      \
    "#define TB_VSTREAM_END()\n"                                                                   \
    "#endif\n"                                                                                     \
    "#define TB_BITS_F32(b) as_float(b)\n"                                                         \
    "#define TB_F32_BITS(f) as_uint(f)\n"                                                          \
    "/* f16 through the built-ins every OpenCL C device has (no cl_khr_fp16 needed) */\n"          \
    "#define TB_LDH(p, i) vload_half((i), (const __global half *)(p))\n"                           \
    "#define TB_STH(p, i, v) vstore_half_rte((v), (i), (__global half *)(p))\n"                    \
    "#define TB_HAS_F16_CVT 1\n"                                                                   \
    "uint tb_f2h(float x) {\n"                                                                     \
    "    ushort h; vstore_half_rte(x, 0, (__private half *)&h); return h;\n"                       \
    "}\n"                                                                                          \
    "float tb_rnd_f16(float x) {\n"                                                                \
    "    ushort h; vstore_half_rte(x, 0, (__private half *)&h);\n"                                 \
    "    return vload_half(0, (const __private half *)&h);\n"                                      \
    "}\n"                                                                                          \
    "/* TB_VW lanes: f16 through the same built-ins (on x86 without AVX-512 through an */"         \
    "/* empty asm, TB_VOPAQUE: no compare in half), bf16 as the top half of an f32 */\n"           \
    "#if defined(__clang__) && defined(__AVX__) && !defined(__AVX512F__) && (TB_VW == 4 || TB_VW " \
    "== 8)\n"                                                                                      \
    "#define TB_VOPAQUE(x) tb_vopaque(x)\n"                                                        \
    "tb_vf tb_vopaque(tb_vf x) {\n"                                                                \
    "    __asm__(\"\" : \"+x\"(x));\n"                                                             \
    "    return x;\n"                                                                              \
    "}\n"                                                                                          \
    "#else\n"                                                                                      \
    "#define TB_VOPAQUE(x) (x)\n"                                                                  \
    "#endif\n"                                                                                     \
    "#define TB_VLDH(p) TB_VOPAQUE(TB_VN(vload_half)(0, (const __global half *)(p)))\n"            \
    "#define TB_VSTH(v, p) TB_XCAT(TB_VN(vstore_half), _rte)((v), 0, (__global half *)(p))\n"      \
    "#define TB_VRNDH(x) tb_vrnd_f16(x)\n"                                                         \
    "tb_vf tb_vrnd_f16(tb_vf x) {\n"                                                               \
    "    TB_VN(ushort) h; TB_XCAT(TB_VN(vstore_half), _rte)(x, 0, (__private half *)&h);\n"        \
    "    return TB_VOPAQUE(TB_VN(vload_half)(0, (const __private half *)&h));\n"                   \
    "}\n"                                                                                          \
    "#define TB_VLDBF(p) TB_VN(as_float)(TB_VN(convert_uint)(TB_VLD(0, (p))) << 16)\n"             \
    "#define TB_VSTBF(v, p) TB_VST(TB_VN(convert_ushort)(TB_VN(as_uint)(tb_vrnd_bf16(v)) >> 16), " \
    "0, (p))\n"                                                                                    \
    "/* W bytes (a where's condition) as 0 or 1 in each lane */\n"                                 \
    "#define TB_VLDB(p) \\\n"                                                                      \
    "    TB_VN(convert_float)(TB_VN(vload)(0, (const __global uchar *)(p)) != (uchar)0) * -1.0f\n" \
    "\n"

/* The dialect for a device with or without double precision. */
static void tb__dialect_opencl(tb__dialect *d, bool f64) {
    memset(d, 0, sizeof *d);
    d->name = "OpenCL C";
    d->head[0] = f64 ? "/* torch_backend.h: OpenCL C 1.2 */\n"
                       "#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n"
                       "#define TB_HAS_F64 1\n" TB__OCL_HEAD_REST
                     : "/* torch_backend.h: OpenCL C 1.2 */\n" TB__OCL_HEAD_REST;
#undef TB__OCL_HEAD_REST
    d->global = "__global ";
    d->local = "__local ";
    d->barrier = "barrier(CLK_LOCAL_MEM_FENCE);";
    d->global_id = "get_global_id(%d)";
    d->group_id = "get_group_id(%d)";
    d->local_id = "get_local_id(%d)";
    d->vec_zero = "(%s)(0)";
    d->vec_make = "(%s)(%s)";
    d->min_long = "min";
    d->bits_f32 = "as_float";
    d->bits_f64 = "as_double";
    d->err_claim = "atomic_cmpxchg((volatile __global uint *)tb_err, 0u, code) == 0u";
    d->constant = "__constant ";
    d->iabs = "abs";
    d->shuffle = "shuffle2(%s, %s, (uint%d)(%s))";
    d->f64 = f64;
    d->math = tb__oclc_math;
    d->kernel = tb__oclc_emit_kernel;
}

#endif /* TB__HAVE_COMPILED_BACKENDS */
