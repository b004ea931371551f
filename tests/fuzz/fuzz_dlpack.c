/* libFuzzer harness: DLPack import of a producer's tensor with arbitrary ndim, dims, strides,
   byte_offset and dtype over a real 4 KiB buffer. The harness works out on its own, in 128-bit
   arithmetic, which bytes the tensor spans. Where the span leaves int64 the import must fail
   with TB_ERR_OVERFLOW (or an earlier error), never read; where it lies inside the buffer the
   import must succeed exactly when the dtype, ndim and shape are acceptable, its values must be
   the strided elements, and the deleter must run once; a span inside int64 but outside the
   buffer is a producer that lies about its memory, which no consumer can check, and is not
   imported; nor is a valid tensor of more than 1 MiB (a broadcast over stride 0: the import
   copies every element, which a sanitizer's allocator refuses to try). */
#include "fuzz_common.h"

#define DL_BUF 4096

__extension__ typedef __int128 dl_wide;

typedef struct dl_producer {
    tb_dl_managed_tensor managed;
    tb_dl_managed_tensor_versioned versioned;
    int64_t shape[TB_MAX_RANK + 2];
    int64_t strides[TB_MAX_RANK + 2];
    int deleter_calls;
} dl_producer;

static void dl_deleter(tb_dl_managed_tensor *self) {
    ((dl_producer *)self->manager_ctx)->deleter_calls++;
}

static void dl_deleter_versioned(tb_dl_managed_tensor_versioned *self) {
    ((dl_producer *)self->manager_ctx)->deleter_calls++;
}

/* The element `index` of a strided tensor, read as the library must read it. */
static void dl_expected(const dl_producer *p, const unsigned char *base, size_t width, int32_t ndim,
                        int64_t index, unsigned char *out) {
    int64_t offset = 0, rest = index;
    int32_t d;
    for (d = ndim - 1; d >= 0; d--) {
        int64_t i = rest % p->shape[d];
        rest /= p->shape[d];
        offset += i * (p->managed.dl_tensor.strides != NULL ? p->strides[d] : 0);
    }
    if (p->managed.dl_tensor.strides == NULL) offset = index;
    memcpy(out, base + offset * (int64_t)width, width);
}

static int fuzz_dlpack_one(const uint8_t *data, size_t size) {
    static unsigned char buf[DL_BUF];
    static const uint8_t codes[] = {TB_DL_FLOAT, TB_DL_INT, TB_DL_UINT, TB_DL_BOOL, TB_DL_BFLOAT};
    static const uint8_t bits[] = {8, 16, 32, 64, 1};
    fuzz_bytes b;
    dl_producer p;
    tb_dl_tensor *dl;
    tb_tensor *t;
    tb_dtype dtype = TB_F32;
    bool dtype_ok, shape_ok, versioned, strided, null_data;
    int32_t ndim, d;
    size_t width = 0, i;
    int64_t numel = 0;
    dl_wide lo, hi, start;
    uint8_t flags;
    b.data = data;
    b.size = size;
    b.pos = 0;
    fuzz_setup();
    for (i = 0; i < DL_BUF; i++)
        buf[i] = (unsigned char)(i * 131 + 7);
    memset(&p, 0, sizeof p);
    flags = fuzz_u8(&b);
    versioned = (flags & 1) != 0;
    strided = (flags & 2) != 0;
    null_data = (flags & 0x1c) == 0x1c;
    ndim = (int32_t)(fuzz_u8(&b) % 11) - 1; /* -1..9 */
    dl = &p.managed.dl_tensor;
    dl->device.device_type = (flags & 0xe0) == 0xe0 ? (int32_t)fuzz_u8(&b) : TB_DL_CPU;
    dl->dtype.code = codes[fuzz_u8(&b) % sizeof codes];
    dl->dtype.bits = bits[fuzz_u8(&b) % sizeof bits];
    dl->dtype.lanes = (fuzz_u8(&b) % 16) == 0 ? 2 : 1;
    for (d = 0; d < TB_MAX_RANK + 2; d++) {
        p.shape[d] = d < ndim ? fuzz_dim(&b) : 1;
        p.strides[d] = d < ndim ? fuzz_i64(&b) : 1;
    }
    if (fuzz_u8(&b) % 16 == 0) {
        start = (dl_wide)(fuzz_u64(&b) % (DL_BUF + 1));
    } else {
        start = fuzz_u8(&b); /* low, then high: each read in its own statement */
        start += (dl_wide)fuzz_u8(&b) * 8;
    }
    dl->byte_offset = fuzz_u8(&b) % 8 == 0 ? fuzz_u64(&b) : fuzz_u8(&b) % 16;
    dl->data = null_data ? NULL : buf + (size_t)(start % DL_BUF);
    dl->ndim = ndim;
    dl->shape = p.shape;
    dl->strides = strided ? p.strides : NULL;
    p.managed.manager_ctx = &p;
    p.managed.deleter = dl_deleter;
    p.versioned.version.major = fuzz_u8(&b) % 32 == 0 ? 7 : TB_DLPACK_MAJOR_VERSION;
    p.versioned.manager_ctx = &p;
    p.versioned.deleter = dl_deleter_versioned;
    p.versioned.dl_tensor = *dl;

    /* what the library must accept, worked out independently */
    dtype_ok = dl->device.device_type == TB_DL_CPU && dl->dtype.lanes == 1 &&
               (!versioned || p.versioned.version.major == TB_DLPACK_MAJOR_VERSION);
    if (dtype_ok) {
        if (dl->dtype.code == TB_DL_FLOAT && dl->dtype.bits == 32)
            dtype = TB_F32;
        else if (dl->dtype.code == TB_DL_FLOAT && dl->dtype.bits == 64)
            dtype = TB_F64;
        else if (dl->dtype.code == TB_DL_FLOAT && dl->dtype.bits == 16)
            dtype = TB_F16;
        else if (dl->dtype.code == TB_DL_BFLOAT && dl->dtype.bits == 16)
            dtype = TB_BF16;
        else if (dl->dtype.code == TB_DL_INT && dl->dtype.bits == 32)
            dtype = TB_I32;
        else if (dl->dtype.code == TB_DL_INT && dl->dtype.bits == 64)
            dtype = TB_I64;
        else if (dl->dtype.code == TB_DL_UINT && dl->dtype.bits == 8)
            dtype = TB_U8;
        else if (dl->dtype.code == TB_DL_BOOL && dl->dtype.bits == 8)
            dtype = TB_BOOL;
        else
            dtype_ok = false;
    }
    shape_ok = false;
    if (dtype_ok && ndim >= 0 && ndim <= TB_MAX_RANK) {
        tb_shape s;
        width = tb_dtype_size(dtype);
        shape_ok = tb_shape_make(&s, dtype, ndim, p.shape) == TB_OK;
        if (shape_ok) tb_shape_numel(&s, &numel);
        tb_clear_error();
    }
    if (shape_ok && numel > 0 && null_data) shape_ok = false; /* data NULL with elements */
    lo = hi = (dl_wide)dl->byte_offset;
    if (shape_ok && numel > 0) {
        dl_wide stride = 1;
        for (d = ndim - 1; d >= 0; d--) {
            dl_wide s = strided ? (dl_wide)p.strides[d] : stride, span;
            span = (dl_wide)(p.shape[d] - 1) * s * (dl_wide)width;
            if (p.shape[d] > 1) {
                if (span < 0)
                    lo += span;
                else
                    hi += span;
            }
            stride *= p.shape[d];
        }
        hi += (dl_wide)width;
    }

    tb_clear_error();
    if (shape_ok && (lo < (dl_wide)INT64_MIN || hi > (dl_wide)INT64_MAX ||
                     dl->byte_offset > (uint64_t)INT64_MAX)) {
        /* beyond int64: must be refused before anything is read */
        t = versioned ? tb_dlpack_import_versioned(&p.versioned, NULL)
                      : tb_dlpack_import(&p.managed, NULL);
        if (t != NULL) fuzz_fail("an import whose byte offsets overflow succeeded");
        if (tb_last_status() != TB_ERR_OVERFLOW)
            fuzz_fail("overflowing import failed with %s", tb_status_string(tb_last_status()));
        if (p.deleter_calls != 0) fuzz_fail("deleter ran on a failed import");
        return 0;
    }
    if (shape_ok && !null_data &&
        ((dl_wide)(start % DL_BUF) + lo < 0 || (dl_wide)(start % DL_BUF) + hi > DL_BUF))
        return 0; /* the producer lies about its memory: nothing any consumer can check */
    /* A broadcast (stride 0) of many elements: the import copies them all, and checking each
       element by its strides (several divisions per dimension, under the sanitizers' and the
       fuzzer's instrumentation) takes seconds past 64 Ki elements. */
    if (shape_ok &&
        (numel > (int64_t)1 << 16 || (dl_wide)numel * (dl_wide)width > (dl_wide)1 << 20))
        return 0;
    t = versioned ? tb_dlpack_import_versioned(&p.versioned, NULL)
                  : tb_dlpack_import(&p.managed, NULL);
    if ((t != NULL) != shape_ok) {
        fuzz_fail("import %s, expected %s", t != NULL ? "succeeded" : "failed",
                  shape_ok ? "success" : "failure");
    }
    if (t == NULL) {
        if (tb_last_status() == TB_OK || tb_last_error()[0] == '\0')
            fuzz_fail("failed import without an error");
        if (p.deleter_calls != 0) fuzz_fail("deleter ran on a failed import");
        return 0;
    }
    {
        tb_shape s = tb_tensor_shape(t);
        size_t nbytes = 0;
        unsigned char *host;
        const unsigned char *base =
            numel > 0 ? (const unsigned char *)dl->data + dl->byte_offset : NULL;
        if (s.dtype != dtype || s.rank != ndim) fuzz_fail("imported shape");
        if (tb_shape_nbytes(&s, &nbytes) != TB_OK) fuzz_fail("imported nbytes");
        host = (unsigned char *)malloc(nbytes ? nbytes : 1);
        if (host == NULL) fuzz_fail("malloc");
        if (tb_tensor_to_host(t, host, nbytes) != TB_OK) fuzz_fail("to_host");
        for (i = 0; i < (size_t)numel; i++) {
            unsigned char want[8];
            dl_expected(&p, base, width, ndim, (int64_t)i, want);
            if (dtype == TB_BOOL) want[0] = want[0] != 0;
            if (memcmp(host + i * width, want, width) != 0) fuzz_fail("element %zu differs", i);
        }
        free(host);
    }
    tb_tensor_release(t);
    if (p.deleter_calls != 1) fuzz_fail("deleter ran %d times", p.deleter_calls);
    return 0;
}

#ifndef TB_FUZZ_NO_ENTRY
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    return fuzz_dlpack_one(data, size);
}
#endif
