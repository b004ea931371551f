/* ===========================================================================================
   Dtypes, scalars and shapes
   =========================================================================================== */

typedef enum tb_dtype {
    TB_F32 = 0,
    TB_F64,
    TB_I32,
    TB_I64,
    TB_U8,
    TB_BOOL,
    TB_F16,  /* IEEE binary16: storage and results in 16 bits, arithmetic in f32 */
    TB_BF16, /* bfloat16 (the top half of an f32): storage in 16 bits, arithmetic in f32 */
    TB_DTYPE_COUNT
} tb_dtype;

#define TB_MAX_RANK 8

/* A dtype and its dims. rank 0 is a scalar (numel 1). Dims are >= 0. */
typedef struct tb_shape {
    tb_dtype dtype;
    int32_t rank;
    int64_t dims[TB_MAX_RANK];
} tb_shape;

/* A typed host value: `f` for floating dtypes, `i` for integer and bool dtypes. */
typedef struct tb_scalar {
    tb_dtype dtype;
    double f;
    int64_t i;
} tb_scalar;

/* "f32", "f64", "i32", "i64", "u8", "bool", "f16", "bf16"; "invalid" for anything else. */
TBDEF const char *tb_dtype_name(tb_dtype dtype);
/* Bytes per element (bool is 1 byte); 0 for an invalid dtype. */
TBDEF size_t tb_dtype_size(tb_dtype dtype);
/* Parses a dtype name ("f32", also "float32", "float", "int64", "f16", "float16", "half",
   "bf16", "bfloat16", ...). */
TBDEF tb_status tb_dtype_parse(const char *text, tb_dtype *out);
TBDEF bool tb_dtype_is_valid(tb_dtype dtype);
TBDEF bool tb_dtype_is_float(tb_dtype dtype);   /* f16 bf16 f32 f64 */
TBDEF bool tb_dtype_is_integer(tb_dtype dtype); /* i32 i64 u8 (not bool) */
/* PyTorch's promotion of two tensor dtypes: bool < u8 < i32 < i64 < f16, bf16 < f32 < f64, with
   u8 combined with a signed type giving the signed type (u8 + i32 = i32) and f16 combined with
   bf16 giving f32. */
TBDEF tb_dtype tb_dtype_promote(tb_dtype a, tb_dtype b);

/* f32 <-> f16 and bf16 as bit patterns, as PyTorch converts: to nearest, ties to even;
   values beyond the largest finite number give infinity; f16 subnormals are kept; a NaN stays a
   NaN of the same sign (f32 -> f16/bf16 gives a quiet NaN with the top payload bits; f16/bf16
   -> f32 keeps the payload). Pure functions: thread-safe. */
TBDEF uint16_t tb_f32_to_f16(float value);
TBDEF float tb_f16_to_f32(uint16_t bits);
TBDEF uint16_t tb_f32_to_bf16(float value);
TBDEF float tb_bf16_to_f32(uint16_t bits);

/* Scalars of each kind. */
TBDEF tb_scalar tb_scalar_f(tb_dtype dtype, double value);
TBDEF tb_scalar tb_scalar_i(tb_dtype dtype, int64_t value);
/* The value as a double / as an int64 (truncating), whatever its dtype. */
TBDEF double tb_scalar_as_double(tb_scalar s);
TBDEF int64_t tb_scalar_as_int(tb_scalar s);

/* Builds a shape, checking dtype, rank (0..TB_MAX_RANK), dims >= 0 and the size rule: the byte
   size must fit in int64 and in size_t (TB_ERR_OVERFLOW otherwise). An empty shape obeys the
   same rule with its 0 dims read as 1, so that its strides fit too: f32[3,2^63-1,0] is rejected
   (as in PyTorch) and so is f32[0,3,2^63-1] (which PyTorch accepts with overflowing strides).
   `dims` may be NULL when rank is 0. On error *out is untouched. */
TBDEF tb_status tb_shape_make(tb_shape *out, tb_dtype dtype, int32_t rank, const int64_t *dims);
/* Convenience for literals: tb_shape_of(TB_F32, 2, 3, 4) is f32[3,4]. A macro in C and a
   template in C++ that convert the rank and every dim to int64_t, so that int64_t variables
   and dims above INT_MAX are read whole, and a count of dims that is not the rank is an error
   (TB_ERR_INVALID_ARGUMENT). Checks as tb_shape_make; on error it returns a shape of rank -1
   (which every function rejects) and sets the error. The function behind the name,
   `(tb_shape_of)(dtype, rank, ...)`, reads its dims as `int` (kept for callers through a
   symbol, such as a foreign-function interface). */
TBDEF tb_shape tb_shape_of(tb_dtype dtype, int32_t rank, ...);
/* What tb_shape_of expands to: `count` numbers, the rank and then the dims. */
TBDEF tb_shape tb_shape_of_dims(tb_dtype dtype, size_t count, const int64_t *rank_and_dims);

/* Element count; TB_ERR_OVERFLOW for a shape that breaks the size rule of tb_shape_make. */
TBDEF tb_status tb_shape_numel(const tb_shape *shape, int64_t *out);
/* Byte size; TB_ERR_OVERFLOW for a shape that breaks the size rule of tb_shape_make. */
TBDEF tb_status tb_shape_nbytes(const tb_shape *shape, size_t *out);
/* Same dtype, rank and dims. NULL equals nothing. */
TBDEF bool tb_shape_equal(const tb_shape *a, const tb_shape *b);
/* Checks a shape as tb_shape_make does (for shapes built by hand). */
TBDEF tb_status tb_shape_validate(const tb_shape *shape);
/* NumPy/PyTorch broadcasting of the dims; the result's dtype is tb_dtype_promote of both.
   Error: "tb_shape_broadcast: shapes f32[2,3] and f32[4] do not broadcast". */
TBDEF tb_status tb_shape_broadcast(const tb_shape *a, const tb_shape *b, tb_shape *out);
/* Row-major element strides of a contiguous tensor of this shape. */
TBDEF tb_status tb_shape_strides(const tb_shape *shape, int64_t strides[TB_MAX_RANK]);
/* Writes "f32[2,3]" ("f32[]" for rank 0) like snprintf: returns the length the full text needs
   (without the NUL), writes at most `cap` bytes including the NUL. `buf` NULL: just the
   length (`cap` is ignored). */
TBDEF size_t tb_shape_format(const tb_shape *shape, char *buf, size_t cap);
/* Parses the text form back ("f32[2,3]", "i64[]", spaces allowed around numbers).
   Bad text is TB_ERR_INVALID_ARGUMENT with the position; a valid text with too large dims is
   TB_ERR_OVERFLOW. On error *out is untouched. */
TBDEF tb_status tb_shape_parse(const char *text, tb_shape *out);

/* tb_shape_of's dims are read as int64_t whatever their type (see above): each converted by
   an explicit cast (no conversion warning for size_t dims), up to 10 numbers (the rank and 9
   dims; rank 9 is an error, but a readable one). */
#if defined(__cplusplus)
extern "C++" {
template <typename... TbDims>
inline tb_shape tb_shape_of(tb_dtype dtype, int32_t rank, TbDims... dims) {
    const int64_t all[] = {static_cast<int64_t>(rank), static_cast<int64_t>(dims)...};
    return tb_shape_of_dims(dtype, sizeof all / sizeof all[0], all);
}
}
#else
#define TB__SO_COUNT_(a, b, c, d, e, f, g, h, i, j, n, ...) n
#define TB__SO_COUNT(...)                                   TB__SO_COUNT_(__VA_ARGS__, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
#define TB__SO_1(a)                                         (int64_t)(a)
#define TB__SO_2(a, ...)                                    (int64_t)(a), TB__SO_1(__VA_ARGS__)
#define TB__SO_3(a, ...)                                    (int64_t)(a), TB__SO_2(__VA_ARGS__)
#define TB__SO_4(a, ...)                                    (int64_t)(a), TB__SO_3(__VA_ARGS__)
#define TB__SO_5(a, ...)                                    (int64_t)(a), TB__SO_4(__VA_ARGS__)
#define TB__SO_6(a, ...)                                    (int64_t)(a), TB__SO_5(__VA_ARGS__)
#define TB__SO_7(a, ...)                                    (int64_t)(a), TB__SO_6(__VA_ARGS__)
#define TB__SO_8(a, ...)                                    (int64_t)(a), TB__SO_7(__VA_ARGS__)
#define TB__SO_9(a, ...)                                    (int64_t)(a), TB__SO_8(__VA_ARGS__)
#define TB__SO_10(a, ...)                                   (int64_t)(a), TB__SO_9(__VA_ARGS__)
#define TB__SO_CAT_(a, b)                                   a##b
#define TB__SO_CAT(a, b)                                    TB__SO_CAT_(a, b)
#define tb_shape_of(dtype, ...)                                                                    \
    tb_shape_of_dims(                                                                              \
        (dtype), (size_t)TB__SO_COUNT(__VA_ARGS__),                                                \
        (const int64_t[]){TB__SO_CAT(TB__SO_, TB__SO_COUNT(__VA_ARGS__))(__VA_ARGS__)})
#endif
