/* ===========================================================================================
   Dtypes, scalars and shapes
   =========================================================================================== */
#include "../impl_begin.h"

TBDEF bool tb_dtype_is_valid(tb_dtype dtype) {
    return (int)dtype >= 0 && (int)dtype < (int)TB_DTYPE_COUNT;
}

TBDEF const char *tb_dtype_name(tb_dtype dtype) {
    switch (dtype) {
    case TB_F32:
        return "f32";
    case TB_F64:
        return "f64";
    case TB_I32:
        return "i32";
    case TB_I64:
        return "i64";
    case TB_U8:
        return "u8";
    case TB_BOOL:
        return "bool";
    case TB_F16:
        return "f16";
    case TB_BF16:
        return "bf16";
    case TB_DTYPE_COUNT:
        break;
    }
    return "invalid";
}

TBDEF size_t tb_dtype_size(tb_dtype dtype) {
    switch (dtype) {
    case TB_F32:
        return 4;
    case TB_F64:
        return 8;
    case TB_I32:
        return 4;
    case TB_I64:
        return 8;
    case TB_U8:
        return 1;
    case TB_BOOL:
        return 1;
    case TB_F16:
    case TB_BF16:
        return 2;
    case TB_DTYPE_COUNT:
        break;
    }
    return 0;
}

TBDEF tb_status tb_dtype_parse(const char *text, tb_dtype *out) {
    static const struct {
        const char *name;
        tb_dtype dtype;
    } names[] = {
        {"f32", TB_F32},     {"float32", TB_F32}, {"float", TB_F32}, {"f64", TB_F64},
        {"float64", TB_F64}, {"double", TB_F64},  {"i32", TB_I32},   {"int32", TB_I32},
        {"int", TB_I32},     {"i64", TB_I64},     {"int64", TB_I64}, {"long", TB_I64},
        {"u8", TB_U8},       {"uint8", TB_U8},    {"bool", TB_BOOL}, {"f16", TB_F16},
        {"float16", TB_F16}, {"half", TB_F16},    {"bf16", TB_BF16}, {"bfloat16", TB_BF16}};
    size_t i;
    if (text == NULL || out == NULL) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_dtype_parse: %s is NULL",
                         text == NULL ? "text" : "out");
    }
    for (i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (strcmp(text, names[i].name) == 0) {
            *out = names[i].dtype;
            return TB_OK;
        }
    }
    return tb__error(TB_ERR_INVALID_ARGUMENT,
                     "tb_dtype_parse: unknown dtype '%.64s' (expected f32, f64, f16, bf16, i32, "
                     "i64, u8 or bool)",
                     text);
}

TBDEF bool tb_dtype_is_float(tb_dtype dtype) {
    return dtype == TB_F32 || dtype == TB_F64 || dtype == TB_F16 || dtype == TB_BF16;
}

TBDEF bool tb_dtype_is_integer(tb_dtype dtype) {
    return dtype == TB_I32 || dtype == TB_I64 || dtype == TB_U8;
}

/* Position in the promotion lattice, a chain but for f16 and bf16, which share a place (their
   join is f32: tb_dtype_promote). */
static int tb__dtype_rank(tb_dtype dtype) {
    switch (dtype) {
    case TB_BOOL:
        return 0;
    case TB_U8:
        return 1;
    case TB_I32:
        return 2;
    case TB_I64:
        return 3;
    case TB_F16:
    case TB_BF16:
        return 4;
    case TB_F32:
        return 5;
    case TB_F64:
        return 6;
    case TB_DTYPE_COUNT:
        break;
    }
    return -1;
}

TBDEF tb_dtype tb_dtype_promote(tb_dtype a, tb_dtype b) {
    if (!tb_dtype_is_valid(a) || !tb_dtype_is_valid(b)) {
        tb__error(TB_ERR_DTYPE, "tb_dtype_promote: invalid dtype %d",
                  tb_dtype_is_valid(a) ? (int)b : (int)a);
        return TB_DTYPE_COUNT;
    }
    if ((a == TB_F16 && b == TB_BF16) || (a == TB_BF16 && b == TB_F16)) return TB_F32;
    return tb__dtype_rank(a) >= tb__dtype_rank(b) ? a : b;
}

/* ---- 16-bit floats ---- */

static uint32_t tb__f32_bits(float value) {
    uint32_t u;
    memcpy(&u, &value, sizeof u);
    return u;
}

static float tb__f32_of_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* value >> shift, rounded to nearest with ties to even. */
static uint32_t tb__round_shift(uint32_t value, int shift) {
    uint32_t q = value >> shift, rem = value & ((1u << shift) - 1u), half = 1u << (shift - 1);
    return q + (rem > half || (rem == half && (q & 1u)) ? 1u : 0u);
}

TBDEF uint16_t tb_f32_to_f16(float value) {
    uint32_t u = tb__f32_bits(value), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to infinity */
    if (a >= 0x38800000u) return (uint16_t)(sign | tb__round_shift(a - 0x38000000u, 13));
    if ((a >> 23) < 102u) return (uint16_t)sign; /* below half the smallest subnormal */
    /* a subnormal: the significand with its hidden bit, in units of 2^-24 */
    return (uint16_t)(sign | tb__round_shift((a & 0x7fffffu) | 0x800000u, (int)(126u - (a >> 23))));
}

TBDEF float tb_f16_to_f32(uint16_t bits) {
    uint32_t sign = ((uint32_t)bits & 0x8000u) << 16, e = ((uint32_t)bits >> 10) & 0x1fu;
    uint32_t m = (uint32_t)bits & 0x3ffu;
    if (e == 0x1fu) return tb__f32_of_bits(sign | 0x7f800000u | (m << 13));
    if (e != 0) return tb__f32_of_bits(sign | ((e + 112u) << 23) | (m << 13));
    if (m == 0) return tb__f32_of_bits(sign);
    e = 113u;
    while ((m & 0x400u) == 0) {
        m <<= 1;
        e--;
    }
    return tb__f32_of_bits(sign | (e << 23) | ((m & 0x3ffu) << 13));
}

TBDEF uint16_t tb_f32_to_bf16(float value) {
    uint32_t u = tb__f32_bits(value);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

TBDEF float tb_bf16_to_f32(uint16_t bits) {
    return tb__f32_of_bits((uint32_t)bits << 16);
}

/* double -> float as IEEE rounds, with no undefined behaviour out of float's range: below
   FLT_MAX + half an ulp (2^103) to FLT_MAX, beyond it to infinity. */
static float tb__f64_to_f32(double d) {
    double limit = (double)FLT_MAX + ldexp(1.0, 103);
    if (d > (double)FLT_MAX) return d < limit ? FLT_MAX : HUGE_VALF;
    if (d < -(double)FLT_MAX) return d > -limit ? -FLT_MAX : -HUGE_VALF;
    return (float)d;
}

/* A double as the bits of a 16-bit float dtype (through f32, as PyTorch converts). */
static uint16_t tb__f64_to_half(tb_dtype dtype, double d) {
    float f = tb__f64_to_f32(d);
    return dtype == TB_F16 ? tb_f32_to_f16(f) : tb_f32_to_bf16(f);
}

static double tb__half_to_f64(tb_dtype dtype, uint16_t bits) {
    return (double)(dtype == TB_F16 ? tb_f16_to_f32(bits) : tb_bf16_to_f32(bits));
}

/* ---- scalars ---- */

/* double -> int64 without undefined behaviour: truncates, saturates, NaN gives 0. */
static int64_t tb__double_to_i64(double v) {
    if (v != v) return 0;
    if (v >= 9223372036854775807.0) return INT64_MAX;
    if (v <= -9223372036854775808.0) return INT64_MIN;
    return (int64_t)v;
}

/* An integer brought into an integer dtype's range the way a C cast does (wrapping). */
static int64_t tb__wrap_int(tb_dtype dtype, int64_t v) {
    switch (dtype) {
    case TB_I32: {
        uint32_t u = (uint32_t)(uint64_t)v;
        return u <= (uint32_t)INT32_MAX ? (int64_t)u : (int64_t)u - (int64_t)4294967296LL;
    }
    case TB_U8:
        return (int64_t)(uint8_t)(uint64_t)v;
    case TB_BOOL:
        return v != 0;
    default:
        return v;
    }
}

TBDEF tb_scalar tb_scalar_f(tb_dtype dtype, double value) {
    tb_scalar s;
    s.dtype = dtype;
    if (!tb_dtype_is_valid(dtype)) {
        tb__error(TB_ERR_DTYPE, "tb_scalar_f: invalid dtype %d", (int)dtype);
        s.f = value;
        s.i = 0;
    } else if (tb_dtype_is_float(dtype)) {
        s.f = value;
        s.i = tb__double_to_i64(value);
    } else if (dtype == TB_BOOL) {
        s.i = value != 0.0;
        s.f = (double)s.i;
    } else {
        s.i = tb__wrap_int(dtype, tb__double_to_i64(value));
        s.f = (double)s.i;
    }
    return s;
}

TBDEF tb_scalar tb_scalar_i(tb_dtype dtype, int64_t value) {
    tb_scalar s;
    s.dtype = dtype;
    if (!tb_dtype_is_valid(dtype)) {
        tb__error(TB_ERR_DTYPE, "tb_scalar_i: invalid dtype %d", (int)dtype);
        s.i = value;
        s.f = 0.0;
    } else if (tb_dtype_is_float(dtype)) {
        s.f = (double)value;
        s.i = value;
    } else {
        s.i = tb__wrap_int(dtype, value);
        s.f = (double)s.i;
    }
    return s;
}

TBDEF double tb_scalar_as_double(tb_scalar s) {
    return tb_dtype_is_float(s.dtype) ? s.f : (double)s.i;
}

TBDEF int64_t tb_scalar_as_int(tb_scalar s) {
    return tb_dtype_is_float(s.dtype) ? tb__double_to_i64(s.f) : s.i;
}

/* Writes one element of `dtype` holding the scalar's value (C conversion rules, with
   out-of-range floats saturating instead of being undefined). */
static TB__UNUSED void tb__scalar_store(tb_scalar value, tb_dtype dtype, void *out) {
    switch (dtype) {
    case TB_F32: {
        /* out of float range the cast is undefined in C: tb__f64_to_f32 rounds as IEEE does */
        float f = tb__f64_to_f32(tb_scalar_as_double(value));
        memcpy(out, &f, sizeof f);
        break;
    }
    case TB_F16:
    case TB_BF16: {
        uint16_t h = tb__f64_to_half(dtype, tb_scalar_as_double(value));
        memcpy(out, &h, sizeof h);
        break;
    }
    case TB_F64: {
        double d = tb_scalar_as_double(value);
        memcpy(out, &d, sizeof d);
        break;
    }
    case TB_I32: {
        int32_t v = (int32_t)tb__wrap_int(TB_I32, tb_scalar_as_int(value));
        memcpy(out, &v, sizeof v);
        break;
    }
    case TB_I64: {
        int64_t v = tb_scalar_as_int(value);
        memcpy(out, &v, sizeof v);
        break;
    }
    case TB_U8: {
        uint8_t v = (uint8_t)tb__wrap_int(TB_U8, tb_scalar_as_int(value));
        memcpy(out, &v, sizeof v);
        break;
    }
    case TB_BOOL: {
        uint8_t v = (uint8_t)(tb_dtype_is_float(value.dtype) ? value.f != 0.0 : value.i != 0);
        memcpy(out, &v, sizeof v);
        break;
    }
    case TB_DTYPE_COUNT:
        break;
    }
}

/* ---- shapes ---- */

/* "f32[2,3]", cut with "...]" in the (absurd) case it does not fit 96 bytes. */
static TB__UNUSED size_t tb__shape_text(const tb_shape *shape, char buf[96]) {
    char big[320];
    size_t n = tb_shape_format(shape, big, sizeof big);
    if (n >= sizeof big) n = sizeof big - 1;
    if (n > 95) {
        memcpy(buf, big, 91);
        memcpy(buf + 91, "...]", 5);
        return 95;
    }
    memcpy(buf, big, n + 1);
    return n;
}

/* The size rule of every shape, empty or not: the product of the dims with each 0 read as 1
   (the element count of the shape's contiguous strides), times the element size, fits in
   TB__MAX_BYTES. So an element count, a contiguous stride and a byte offset inside any valid
   shape fit in int64 and size_t whatever the order of the dims, and the arithmetic on them
   cannot overflow. PyTorch makes the same check ("Storage size calculation overflowed") but
   stops at the first overflowing partial product, so it rejects f32[3,2^63-1,0] yet accepts
   f32[0,3,2^63-1], whose strides then overflow; here both are rejected.
   Sets *extent to that product and returns 0, or returns 1 when the product does not fit in
   int64, 2 when the byte size does not fit. The dims must be >= 0. */
static int tb__dims_extent(int32_t rank, const int64_t *dims, tb_dtype dtype, int64_t *extent) {
    int64_t n = 1, bytes;
    int32_t i;
    for (i = 0; i < rank; i++) {
        if (!tb__mul_i64(n, dims[i] == 0 ? 1 : dims[i], &n)) return 1;
    }
    if (!tb__mul_i64(n, (int64_t)tb_dtype_size(dtype), &bytes) || bytes > TB__MAX_BYTES) return 2;
    *extent = n;
    return 0;
}

static bool tb__shape_has_zero(const tb_shape *shape) {
    int32_t i;
    for (i = 0; i < shape->rank; i++) {
        if (shape->dims[i] == 0) return true;
    }
    return false;
}

/* The checks of tb_shape_make on a filled shape; messages start with `fn`. */
static tb_status tb__shape_check(const char *fn, const tb_shape *shape) {
    int32_t i;
    int64_t extent;
    int why;
    char text[96];
    if (shape == NULL) return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: shape is NULL", fn);
    if (!tb_dtype_is_valid(shape->dtype)) {
        return tb__error(TB_ERR_DTYPE, "%s: invalid dtype %d", fn, (int)shape->dtype);
    }
    if (shape->rank < 0 || shape->rank > TB_MAX_RANK) {
        return tb__error(TB_ERR_SHAPE, "%s: rank %d out of range 0..%d", fn, (int)shape->rank,
                         TB_MAX_RANK);
    }
    for (i = 0; i < shape->rank; i++) {
        if (shape->dims[i] < 0) {
            return tb__error(TB_ERR_SHAPE, "%s: dim %d is %lld (dims must be >= 0)", fn, (int)i,
                             (long long)shape->dims[i]);
        }
    }
    why = tb__dims_extent(shape->rank, shape->dims, shape->dtype, &extent);
    if (why == 0) return TB_OK;
    tb__shape_text(shape, text);
    if (tb__shape_has_zero(shape)) {
        return tb__error(TB_ERR_OVERFLOW,
                         "%s: %s is empty, but with its 0 dims read as 1 its %s (empty shapes "
                         "obey the same limit, so that their strides fit)",
                         fn, text,
                         why == 1 ? "element count does not fit in int64"
                                  : "byte size does not fit in int64 and size_t");
    }
    if (why == 1) {
        return tb__error(TB_ERR_OVERFLOW, "%s: %s has more elements than fit in int64", fn, text);
    }
    return tb__error(TB_ERR_OVERFLOW, "%s: the byte size of %s does not fit in int64 and size_t",
                     fn, text);
}

/* Whether a shape with valid dtype, rank and dims >= 0 obeys the size rule (no error set). */
static TB__UNUSED bool tb__shape_size_ok(const tb_shape *shape) {
    int64_t extent;
    return tb__dims_extent(shape->rank, shape->dims, shape->dtype, &extent) == 0;
}

/* The element count of a shape that passed tb__shape_check (so it cannot overflow; a broken
   shape saturates rather than wrap). */
static int64_t tb__shape_numel(const tb_shape *shape) {
    int64_t n = 1;
    int32_t i;
    for (i = 0; i < shape->rank; i++) {
        if (!tb__mul_i64(n, shape->dims[i], &n)) return INT64_MAX;
    }
    return n;
}

TBDEF tb_status tb_shape_make(tb_shape *out, tb_dtype dtype, int32_t rank, const int64_t *dims) {
    tb_shape s;
    tb_status st;
    int32_t i;
    if (out == NULL) return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_shape_make: out is NULL");
    if (rank > 0 && rank <= TB_MAX_RANK && dims == NULL) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_shape_make: dims is NULL for rank %d",
                         (int)rank);
    }
    memset(&s, 0, sizeof s);
    s.dtype = dtype;
    s.rank = rank;
    if (rank > 0 && rank <= TB_MAX_RANK) {
        for (i = 0; i < rank; i++)
            s.dims[i] = dims[i];
    }
    st = tb__shape_check("tb_shape_make", &s);
    if (st != TB_OK) return st;
    *out = s;
    return TB_OK;
}

/* The shape tb_shape_of returns for `s`: itself when valid, else of rank -1 (the error set). */
static tb_shape tb__shape_of_checked(tb_shape s) {
    if (tb__shape_check("tb_shape_of", &s) != TB_OK) {
        memset(s.dims, 0, sizeof s.dims);
        s.rank = -1;
    }
    return s;
}

/* In parentheses: the name is a macro in C (the function stays for callers by symbol). */
TBDEF tb_shape(tb_shape_of)(tb_dtype dtype, int32_t rank, ...) {
    tb_shape s;
    va_list ap;
    int32_t i;
    memset(&s, 0, sizeof s);
    s.dtype = dtype;
    s.rank = rank;
    if (rank > 0 && rank <= TB_MAX_RANK) {
        va_start(ap, rank);
        for (i = 0; i < rank; i++)
            s.dims[i] = (int64_t)va_arg(ap, int);
        va_end(ap);
    }
    return tb__shape_of_checked(s);
}

TBDEF tb_shape tb_shape_of_dims(tb_dtype dtype, size_t count, const int64_t *rank_and_dims) {
    tb_shape s;
    int32_t i;
    memset(&s, 0, sizeof s);
    s.dtype = dtype;
    s.rank = -1;
    if (rank_and_dims == NULL || count == 0) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "tb_shape_of: no rank given");
        return s;
    }
    if (rank_and_dims[0] != (int64_t)count - 1) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "tb_shape_of: rank %lld but %zu dims given",
                  (long long)rank_and_dims[0], count - 1);
        return s;
    }
    s.rank = count - 1 > (size_t)TB_MAX_RANK ? TB_MAX_RANK + 1 : (int32_t)(count - 1);
    for (i = 0; i < s.rank && i < TB_MAX_RANK; i++)
        s.dims[i] = rank_and_dims[1 + i];
    return tb__shape_of_checked(s);
}

TBDEF tb_status tb_shape_validate(const tb_shape *shape) {
    return tb__shape_check("tb_shape_validate", shape);
}

TBDEF tb_status tb_shape_numel(const tb_shape *shape, int64_t *out) {
    tb_status st;
    if (out == NULL) return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_shape_numel: out is NULL");
    st = tb__shape_check("tb_shape_numel", shape);
    if (st != TB_OK) return st;
    *out = tb__shape_numel(shape);
    return TB_OK;
}

TBDEF tb_status tb_shape_nbytes(const tb_shape *shape, size_t *out) {
    tb_status st;
    if (out == NULL) return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_shape_nbytes: out is NULL");
    st = tb__shape_check("tb_shape_nbytes", shape);
    if (st != TB_OK) return st;
    /* fits: the size rule bounds it by TB__MAX_BYTES */
    *out = (size_t)tb__shape_numel(shape) * tb_dtype_size(shape->dtype);
    return TB_OK;
}

TBDEF bool tb_shape_equal(const tb_shape *a, const tb_shape *b) {
    int32_t i, rank;
    if (a == NULL || b == NULL) return false;
    if (a->dtype != b->dtype || a->rank != b->rank) return false;
    rank = a->rank < 0 ? 0 : (a->rank > TB_MAX_RANK ? TB_MAX_RANK : a->rank);
    for (i = 0; i < rank; i++) {
        if (a->dims[i] != b->dims[i]) return false;
    }
    return true;
}

TBDEF tb_status tb_shape_broadcast(const tb_shape *a, const tb_shape *b, tb_shape *out) {
    tb_shape r;
    tb_status st;
    int32_t i;
    if (a == NULL || b == NULL || out == NULL) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_shape_broadcast: %s is NULL",
                         a == NULL ? "a" : (b == NULL ? "b" : "out"));
    }
    st = tb__shape_check("tb_shape_broadcast", a);
    if (st == TB_OK) st = tb__shape_check("tb_shape_broadcast", b);
    if (st != TB_OK) return st;
    memset(&r, 0, sizeof r);
    r.dtype = tb_dtype_promote(a->dtype, b->dtype);
    r.rank = a->rank > b->rank ? a->rank : b->rank;
    for (i = 0; i < r.rank; i++) {
        /* aligned from the last dim; a missing dim counts as 1 */
        int32_t ia = a->rank - r.rank + i, ib = b->rank - r.rank + i;
        int64_t da = ia >= 0 ? a->dims[ia] : 1, db = ib >= 0 ? b->dims[ib] : 1;
        if (da == db || db == 1) {
            r.dims[i] = da;
        } else if (da == 1) {
            r.dims[i] = db;
        } else {
            char ta[96], tb[96];
            tb__shape_text(a, ta);
            tb__shape_text(b, tb);
            return tb__error(TB_ERR_SHAPE, "tb_shape_broadcast: shapes %s and %s do not broadcast",
                             ta, tb);
        }
    }
    st = tb__shape_check("tb_shape_broadcast", &r);
    if (st != TB_OK) return st;
    *out = r;
    return TB_OK;
}

TBDEF tb_status tb_shape_strides(const tb_shape *shape, int64_t strides[TB_MAX_RANK]) {
    int64_t s[TB_MAX_RANK], acc = 1;
    int32_t i;
    tb_status st;
    if (strides == NULL) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_shape_strides: strides is NULL");
    }
    st = tb__shape_check("tb_shape_strides", shape);
    if (st != TB_OK) return st;
    memset(s, 0, sizeof s);
    /* As PyTorch: a dim of size 0 counts as 1, so strides stay meaningful for empty tensors. The
       size rule makes every product fit; the check only guards against a broken invariant. */
    for (i = shape->rank - 1; i >= 0; i--) {
        s[i] = acc;
        if (!tb__mul_i64(acc, shape->dims[i] == 0 ? 1 : shape->dims[i], &acc)) {
            char text[96];
            tb__shape_text(shape, text);
            return tb__error(TB_ERR_OVERFLOW, "tb_shape_strides: the strides of %s overflow int64",
                             text);
        }
    }
    memcpy(strides, s, sizeof s);
    return TB_OK;
}

TBDEF size_t tb_shape_format(const tb_shape *shape, char *buf, size_t cap) {
    char text[320];
    int n = 0;
    int32_t i;
    size_t len;
    if (shape == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "tb_shape_format: shape is NULL");
        text[0] = '\0';
    } else if (shape->rank < 0 || shape->rank > TB_MAX_RANK) {
        n = snprintf(text, sizeof text, "%s[rank %d]", tb_dtype_name(shape->dtype),
                     (int)shape->rank);
    } else {
        n = snprintf(text, sizeof text, "%s[", tb_dtype_name(shape->dtype));
        for (i = 0; i < shape->rank; i++) {
            n += snprintf(text + n, sizeof text - (size_t)n, i == 0 ? "%lld" : ",%lld",
                          (long long)shape->dims[i]);
        }
        n += snprintf(text + n, sizeof text - (size_t)n, "]");
    }
    len = n < 0 ? 0 : (size_t)n;
    if (buf != NULL && cap > 0) {
        size_t c = len < cap ? len : cap - 1;
        memcpy(buf, text, c);
        buf[c] = '\0';
    }
    return len;
}

static bool tb__is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

TBDEF tb_status tb_shape_parse(const char *text, tb_shape *out) {
    tb_shape s;
    tb_status st;
    char name[16];
    size_t pos = 0, n = 0;
    if (text == NULL || out == NULL) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_shape_parse: %s is NULL",
                         text == NULL ? "text" : "out");
    }
    memset(&s, 0, sizeof s);
    while ((text[pos] >= 'a' && text[pos] <= 'z') || (text[pos] >= '0' && text[pos] <= '9')) {
        if (n + 1 >= sizeof name) break;
        name[n++] = text[pos++];
    }
    name[n] = '\0';
    if (n == 0 || tb_dtype_parse(name, &s.dtype) != TB_OK) {
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "tb_shape_parse: bad shape text '%.100s': unknown dtype at position 0",
                         text);
    }
    if (text[pos] != '[') {
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "tb_shape_parse: bad shape text '%.100s': expected '[' at position %zu",
                         text, pos);
    }
    pos++;
    while (tb__is_space(text[pos]))
        pos++;
    if (text[pos] != ']') {
        for (;;) {
            int64_t v = 0;
            bool too_big = false;
            while (tb__is_space(text[pos]))
                pos++;
            if (text[pos] < '0' || text[pos] > '9') {
                return tb__error(TB_ERR_INVALID_ARGUMENT,
                                 "tb_shape_parse: bad shape text '%.100s': expected a dim (a "
                                 "number >= 0) at position %zu",
                                 text, pos);
            }
            if (s.rank == TB_MAX_RANK) {
                return tb__error(TB_ERR_INVALID_ARGUMENT,
                                 "tb_shape_parse: bad shape text '%.100s': more than %d dims at "
                                 "position %zu",
                                 text, TB_MAX_RANK, pos);
            }
            while (text[pos] >= '0' && text[pos] <= '9') {
                int64_t digit = text[pos] - '0';
                if (!too_big && !tb__muladd_i64(v, 10, digit, &v)) too_big = true;
                pos++;
            }
            if (too_big) {
                return tb__error(TB_ERR_OVERFLOW,
                                 "tb_shape_parse: dim %d of '%.100s' does not fit in int64",
                                 (int)s.rank, text);
            }
            s.dims[s.rank++] = v;
            while (tb__is_space(text[pos]))
                pos++;
            if (text[pos] == ']') break;
            if (text[pos] != ',') {
                return tb__error(TB_ERR_INVALID_ARGUMENT,
                                 "tb_shape_parse: bad shape text '%.100s': expected ',' or ']' at "
                                 "position %zu",
                                 text, pos);
            }
            pos++;
        }
    }
    pos++; /* the ']' */
    if (text[pos] != '\0') {
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "tb_shape_parse: bad shape text '%.100s': unexpected text at position %zu",
                         text, pos);
    }
    st = tb__shape_check("tb_shape_parse", &s);
    if (st != TB_OK) return st;
    *out = s;
    return TB_OK;
}
