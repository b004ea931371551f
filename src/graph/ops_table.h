/* ===========================================================================================
   The elementwise math ops, one row each: everything the library knows of such an op besides
   its id (ir.h's TB_OP_LIST) and its public declaration (tensor.h). The parts that need a
   column expand the table with a macro of their own:
     ir.c          the dtype rule (float only; integer operands cast to f32 or refused)
     ops.c         the public function tb_NAME(x)
     reference_elementwise.c   the reference kernel, in double
     codegen.c and planner_layout.c   the generated code, scalar and vector
     autograd.c    the gradient rule
   =========================================================================================== */
#include "../impl_begin.h"

/* What an op does with integer and bool operands: cast them to f32 first (as PyTorch's exp),
   or refuse them with TB_ERR_DTYPE (as PyTorch's gelu, which has no integer kernel). */
#define TB__INT_CAST   1
#define TB__INT_REFUSE 0

/* The columns of a row, X(ID, name, ints, REF, CODE, CODE_F32, VEC, GRAD):
   ID        the op's id without TB_OP_ (ir.h's TB_OP_LIST lists it)
   name      the public function's name without tb_: tb_NAME(tb_tensor *x) is defined from the
             row and declared in tensor.h
   ints      TB__INT_CAST or TB__INT_REFUSE
   REF       the reference value: a C expression of double x (<math.h>, and the reference's
             helpers tb__ref_*)
   CODE      the generated code's expression, a template: $a is the operand's value, $x the
             same cast to the compute type ($t), $NAME the dialect's math function NAME for
             that type ($exp, $log1p, ...); any other text is copied
   CODE_F32  the template where the compute type is float (f32, f16, bf16), or NULL for CODE:
             a prelude function that vectorises, say
   VEC       the template on a vector of floats, $a the vector (the prelude's TB_V* and tb_v*
             functions), or NULL: the op then ends the vector form of a row
   GRAD      the gradient of x: an expression of the tensors g (the gradient of the result),
             x, y (the result) and s (a scratch tensor pointer, for a value used twice), where
             each new tensor is wrapped in TB__K(...) and TB__C(v) is a constant of x's dtype;
             built from differentiable ops, so that it has a gradient of its own */
/* clang-format off */
#define TB__MATH_OPS(X)                                                                            \
    X(EXP, exp, TB__INT_CAST,                                                                      \
      /* reference */ exp(x),                                                                      \
      /* code      */ "($t)$exp(($t)$a)",                                                          \
      /* float     */ NULL,                                                                        \
      /* vector    */ "TB_VEXP($a)",                                                               \
      /* gradient: g y */                                                                          \
      TB__K(tb_mul(g, y)))                                                                         \
    X(LOG, log, TB__INT_CAST,                                                                      \
      /* reference */ log(x),                                                                      \
      /* code      */ "($t)$log(($t)$a)",                                                          \
      /* float     */ NULL,                                                                        \
      /* vector    */ "TB_VLOG($a)",                                                               \
      /* gradient: g / x */                                                                        \
      TB__K(tb_div(g, x)))                                                                         \
    X(SQRT, sqrt, TB__INT_CAST,                                                                    \
      /* reference */ sqrt(x),                                                                     \
      /* code      */ "$sqrt($a)",                                                                 \
      /* float     */ NULL,                                                                        \
      /* vector    */ "TB_VSQRT($a)",                                                              \
      /* gradient: g / 2y */                                                                       \
      TB__K(tb_div(g, TB__K(tb_mul_scalar(y, 2.0)))))                                              \
    X(RSQRT, rsqrt, TB__INT_CAST,                                                                  \
      /* reference */ 1.0 / sqrt(x),                                                               \
      /* code      */ "($t)(($t)1 / $sqrt(($t)$a))",                                               \
      /* float     */ NULL,                                                                        \
      /* vector    */ "1.0f / TB_VSQRT($a)",                                                       \
      /* gradient: -0.5 g y^3 */                                                                   \
      TB__K(tb_mul(TB__K(tb_mul_scalar(g, -0.5)), TB__K(tb_mul(y, TB__K(tb_mul(y, y)))))))         \
    X(SIN, sin, TB__INT_CAST,                                                                      \
      /* reference */ sin(x),                                                                      \
      /* code      */ "($t)$sin(($t)$a)",                                                          \
      /* float     */ NULL,                                                                        \
      /* vector    */ "tb_vsincos($a, 0)",                                                         \
      /* gradient: g cos(x) */                                                                     \
      TB__K(tb_mul(g, TB__K(tb_cos(x)))))                                                          \
    X(COS, cos, TB__INT_CAST,                                                                      \
      /* reference */ cos(x),                                                                      \
      /* code      */ "($t)$cos(($t)$a)",                                                          \
      /* float     */ NULL,                                                                        \
      /* vector    */ "tb_vsincos($a, 1)",                                                         \
      /* gradient: -g sin(x) */                                                                    \
      TB__K(tb_neg(TB__K(tb_mul(g, TB__K(tb_sin(x)))))))                                           \
    X(TANH, tanh, TB__INT_CAST,                                                                    \
      /* reference */ tanh(x),                                                                     \
      /* code      */ "($t)$tanh(($t)$a)",                                                         \
      /* float     */ NULL,                                                                        \
      /* vector    */ "tb_vtanh($a)",                                                              \
      /* gradient: g (1 - y^2) */                                                                  \
      TB__K(tb_mul(g, TB__K(tb_sub(TB__C(1.0), TB__K(tb_mul(y, y)))))))                            \
    X(SIGMOID, sigmoid, TB__INT_CAST,                                                              \
      /* reference */ tb__ref_sigmoid(x),                                                          \
      /* code: exp of a negative argument only, as the reference */                                \
      "($t)($x >= 0 ? ($t)1 / (($t)1 + $exp(-$x)) : $exp($x) / (($t)1 + $exp($x)))",               \
      /* float     */ NULL,                                                                        \
      /* vector    */ "tb_vsigmoid($a)",                                                           \
      /* gradient: g y (1 - y) */                                                                  \
      TB__K(tb_mul(g, TB__K(tb_mul(y, TB__K(tb_sub(TB__C(1.0), y)))))))                            \
    X(GELU, gelu, TB__INT_REFUSE,                                                                  \
      /* reference */ 0.5 * x * (1.0 + erf(x * 0.70710678118654752440)),                           \
      /* code      */ "($t)(0.5 * ($t)$a * (($t)1 + $erf(($t)$a * 0.70710678118654757)))",         \
      /* float     */ "(float)tb_gelu_f32((float)$a)",                                             \
      /* vector    */ "tb_vgelu($a)",                                                              \
      /* gradient: g (Phi(x) + x phi(x)), s = Phi(x) */                                            \
      (s = TB__K(tb_mul_scalar(                                                                    \
           TB__K(tb_add_scalar(TB__K(tb_erf(TB__K(tb_mul_scalar(x, 0.70710678118654752)))), 1.0)), \
           0.5)),                                                                                  \
       TB__K(tb_mul(g, TB__K(tb_add(s, TB__K(tb_mul(x, TB__K(tb_mul_scalar(                        \
           TB__K(tb_exp(TB__K(tb_mul_scalar(TB__K(tb_mul(x, x)), -0.5)))),                         \
           0.39894228040143268))))))))))                                                           \
    X(SILU, silu, TB__INT_REFUSE,                                                                  \
      /* reference */ x * tb__ref_sigmoid(x),                                                      \
      /* code      */                                                                              \
      "($t)($x * ($x >= 0 ? ($t)1 / (($t)1 + $exp(-$x)) : $exp($x) / (($t)1 + $exp($x))))",        \
      /* float     */ NULL,                                                                        \
      /* vector    */ "$a * tb_vsigmoid($a)",                                                      \
      /* gradient: g s (1 + x (1 - s)), s = sigmoid(x) */                                          \
      (s = TB__K(tb_sigmoid(x)),                                                                   \
       TB__K(tb_mul(g, TB__K(tb_mul(s, TB__K(tb_add_scalar(                                        \
           TB__K(tb_mul(x, TB__K(tb_sub(TB__C(1.0), s)))), 1.0))))))))                             \
    X(RECIPROCAL, reciprocal, TB__INT_CAST,                                                        \
      /* reference */ 1.0 / x,                                                                     \
      /* code      */ "($t)1 / $a",                                                                \
      /* float     */ NULL,                                                                        \
      /* vector    */ "1.0f / $a",                                                                 \
      /* gradient: -g y^2 */                                                                       \
      TB__K(tb_neg(TB__K(tb_mul(g, TB__K(tb_mul(y, y)))))))                                        \
    X(ERF, erf, TB__INT_CAST,                                                                      \
      /* reference */ erf(x),                                                                      \
      /* code      */ "($t)$erf(($t)$a)",                                                          \
      /* float     */ "(float)tb_erf_f32((float)$a)",                                              \
      /* vector    */ "tb_verf($a)",                                                               \
      /* gradient: g 2/sqrt(pi) exp(-x^2) */                                                       \
      TB__K(tb_mul(g, TB__K(tb_mul_scalar(TB__K(tb_exp(TB__K(tb_neg(TB__K(tb_mul(x, x)))))),       \
                                          1.1283791670955126)))))                                  \
    X(SOFTPLUS, softplus, TB__INT_REFUSE,                                                          \
      /* reference */ x > 20.0 ? x : log1p(exp(x)),                                                \
      /* code      */ "($t)($x > ($t)20 ? $x : $log1p($exp($x)))",                                 \
      /* float     */ NULL,                                                                        \
      /* vector    */ "tb_vsoftplus($a)",                                                          \
      /* gradient: g where x > 20, else g sigmoid(x) */                                            \
      TB__K(tb_where(TB__K(tb_gt(x, TB__C(20.0))), g, TB__K(tb_mul(g, TB__K(tb_sigmoid(x)))))))    \
    X(MISH, mish, TB__INT_REFUSE,                                                                  \
      /* reference */ x * tanh(log1p(exp(x))),                                                     \
      /* code      */ "($t)($x * $tanh($log1p($exp($x))))",                                        \
      /* float     */ "(float)tb_mish_f32((float)$a)",                                             \
      /* vector    */ "tb_vmish($a)",                                                              \
      /* gradient: g (s + x sigmoid(x) (1 - s^2)), s = tanh(softplus(x)) */                        \
      (s = TB__K(tb_tanh(TB__K(tb_softplus(x)))),                                                  \
       TB__K(tb_mul(g, TB__K(tb_add(s, TB__K(tb_mul(TB__K(tb_mul(x, TB__K(tb_sigmoid(x)))),        \
           TB__K(tb_sub(TB__C(1.0), TB__K(tb_mul(s, s))))))))))))

/* clang-format on */

/* The data of an elementwise math op's row (its integer rule, for the ops; its code
   templates, for the code generator and the planner). */
typedef struct tb__math_code {
    tb_op op;
    int32_t ints; /* TB__INT_CAST or TB__INT_REFUSE */
    const char *code, *code_f32, *vec;
} tb__math_code;

static const tb__math_code tb__math_codes[] = {
#define TB__MATH_CODE(ID, name, ints, REF, CODE, CODE_F32, VEC, GRAD)                              \
    {TB_OP_##ID, ints, CODE, CODE_F32, VEC},
    TB__MATH_OPS(TB__MATH_CODE)
#undef TB__MATH_CODE
};

/* The row of `op`, NULL when it is not an elementwise math op. */
TB__UNUSED static const tb__math_code *tb__math_code_of(tb_op op) {
    size_t i;
    for (i = 0; i < sizeof tb__math_codes / sizeof tb__math_codes[0]; i++)
        if (tb__math_codes[i].op == op) return &tb__math_codes[i];
    return NULL;
}
