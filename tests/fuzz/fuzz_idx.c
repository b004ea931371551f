/* libFuzzer harness: the input is an IDX file, plain or gzip, loaded with tb_idx_load from a file
   (fuzz_files.h). A load either fails with TB_ERR_FORMAT, TB_ERR_UNSUPPORTED (or
   TB_ERR_OUT_OF_MEMORY) and a message naming the reader, or gives a tensor whose dtype and dims
   are the header's and whose values are the big-endian elements after it, widened where the
   type is i8 or i16; for a gzip file the harness inflates the data itself (with the library's
   inflater) to know them. The tensor is then read back and cast (fuzz_files.h).
   A changed byte in a gzip file almost always breaks its header CRC-16 or its trailer's CRC-32
   and size, which would stop the load before the IDX header is parsed; so a gzip input is
   loaded a second time with those set to what its bytes give. */
#include "fuzz_files.h"

/* The most decompressed bytes the harness inflates (inputs are a few KiB). */
#define IDX_MAX_INFLATED (1u << 20)

static const tb_status idx_load_errors[] = {TB_ERR_FORMAT, TB_ERR_UNSUPPORTED, TB_ERR_OUT_OF_MEMORY,
                                            TB_OK};

static uint32_t idx_be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

/* Checks a loaded tensor against the IDX bytes p[0, size) it came from. */
static void idx_check_tensor(tb_tensor *t, const uint8_t *p, size_t size, const char *what) {
    tb_shape shape = tb_tensor_shape(t);
    size_t header_len, width, count, nbytes = 0, i;
    int64_t numel = 0;
    tb_dtype dtype;
    unsigned char *host, *want;
    int32_t d;
    if (size < 4) fuzz_fail("%s: %zu bytes loaded", what, size);
    switch (p[2]) {
    case 0x08:
        dtype = TB_U8;
        width = 1;
        break;
    case 0x09:
        dtype = TB_I32;
        width = 1;
        break;
    case 0x0b:
        dtype = TB_I32;
        width = 2;
        break;
    case 0x0c:
        dtype = TB_I32;
        width = 4;
        break;
    case 0x0d:
        dtype = TB_F32;
        width = 4;
        break;
    case 0x0e:
        dtype = TB_F64;
        width = 8;
        break;
    default:
        fuzz_fail("%s: type code 0x%02x loaded", what, p[2]);
        return;
    }
    header_len = 4 + 4 * (size_t)p[3];
    if (p[0] != 0 || p[1] != 0 || p[3] == 0 || shape.rank != p[3] || header_len > size)
        fuzz_fail("%s: the magic %02x%02x%02x%02x loaded as rank %d", what, p[0], p[1], p[2], p[3],
                  (int)shape.rank);
    if (shape.dtype != dtype) fuzz_fail("%s: type 0x%02x loaded as %d", what, p[2], shape.dtype);
    for (d = 0; d < shape.rank; d++)
        if (shape.dims[d] != (int64_t)idx_be32(p + 4 + 4 * d))
            fuzz_fail("%s: dim %d is %lld, the header says %lu", what, (int)d,
                      (long long)shape.dims[d], (unsigned long)idx_be32(p + 4 + 4 * d));
    if (tb_shape_numel(&shape, &numel) != TB_OK || tb_shape_nbytes(&shape, &nbytes) != TB_OK)
        fuzz_fail("%s: no size", what);
    count = (size_t)numel;
    if ((size - header_len) / width < count || size - header_len != count * width)
        fuzz_fail("%s: %zu elements loaded from %zu bytes of data", what, count, size - header_len);
    want = (unsigned char *)malloc(nbytes ? nbytes : 1);
    host = (unsigned char *)malloc(nbytes ? nbytes : 1);
    if (want == NULL || host == NULL) fuzz_fail("malloc");
    for (i = 0; i < count; i++) {
        const uint8_t *e = p + header_len + i * width;
        if (p[2] == 0x08) {
            want[i] = e[0];
        } else if (p[2] == 0x09 || p[2] == 0x0b) {
            int32_t v = width == 1 ? (int32_t)(int8_t)e[0]
                                   : (int32_t)(int16_t)(uint16_t)((e[0] << 8) | e[1]);
            memcpy(want + 4 * i, &v, 4);
        } else if (width == 4) {
            uint32_t v = idx_be32(e);
            memcpy(want + 4 * i, &v, 4);
        } else {
            uint64_t v = ((uint64_t)idx_be32(e) << 32) | idx_be32(e + 4);
            memcpy(want + 8 * i, &v, 8);
        }
    }
    if (tb_tensor_to_host(t, host, nbytes) != TB_OK) fuzz_fail("%s: tb_tensor_to_host", what);
    if (memcmp(host, want, nbytes) != 0) fuzz_fail("%s: the values are not the file's", what);
    free(want);
    free(host);
}

/* Where the deflate data of a gzip member start (0 for a header that runs past the end); the
   place of its header CRC-16 into *hcrc (SIZE_MAX when it has none). */
static size_t idx_gzip_start(const uint8_t *p, size_t n, size_t *hcrc) {
    size_t pos = 10;
    const uint8_t *end;
    *hcrc = SIZE_MAX;
    if (n < 10) return 0;
    if (p[3] & 4) {
        if (n - pos < 2) return 0;
        pos += 2 + ((size_t)p[pos] | ((size_t)p[pos + 1] << 8));
        if (pos > n) return 0;
    }
    if (p[3] & 8) {
        end = (const uint8_t *)memchr(p + pos, 0, n - pos);
        if (end == NULL) return 0;
        pos = (size_t)(end - p) + 1;
    }
    if (p[3] & 16) {
        end = (const uint8_t *)memchr(p + pos, 0, n - pos);
        if (end == NULL) return 0;
        pos = (size_t)(end - p) + 1;
    }
    if (p[3] & 2) {
        if (n - pos < 2) return 0;
        *hcrc = pos;
        pos += 2;
    }
    return pos;
}

/* Inflates the deflate data of a gzip member into out[0, IDX_MAX_INFLATED): the bytes it gave,
   or SIZE_MAX when the data are corrupt, truncated or longer; where they end into *used. */
static size_t idx_inflate(const uint8_t *in, size_t in_len, unsigned char *out, size_t *used) {
    tb__inflater s;
    memset(&s, 0, sizeof s);
    s.in = in;
    s.in_len = in_len;
    s.out = out;
    s.out_len = IDX_MAX_INFLATED;
    if (tb__inflate(&s) != NULL && !s.done) return SIZE_MAX;
    if (s.full) return SIZE_MAX;
    *used = s.in_pos + (size_t)s.pad - (size_t)(s.nbits / 8);
    return s.out_pos;
}

static void idx_put32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v & 0xff);
    p[1] = (uint8_t)((v >> 8) & 0xff);
    p[2] = (uint8_t)((v >> 16) & 0xff);
    p[3] = (uint8_t)(v >> 24);
}

static void idx_load_check(const char *name, const uint8_t *data, size_t size,
                           unsigned char *inflated, const char *what) {
    char path[1024];
    tb_tensor *t;
    unsigned char *host;
    size_t nbytes;
    files_write(path, name, data, size);
    tb_clear_error();
    t = tb_idx_load(path, NULL);
    if (t == NULL) {
        files_check_failure("tb_idx_load", idx_load_errors, what);
        tb_clear_error();
        return;
    }
    if (size >= 2 && data[0] == 0x1f && data[1] == 0x8b) {
        size_t hcrc, start = idx_gzip_start(data, size, &hcrc), used = 0, n;
        if (start == 0) fuzz_fail("%s: a bad gzip header loaded", what);
        n = idx_inflate(data + start, size - start, inflated, &used);
        if (n == SIZE_MAX) fuzz_fail("%s: gzip data that do not inflate loaded", what);
        if (size - start - used != 8) fuzz_fail("%s: no trailer or trailing bytes loaded", what);
        idx_check_tensor(t, inflated, n, what);
    } else {
        idx_check_tensor(t, data, size, what);
    }
    host = files_touch(t, &nbytes, what);
    free(host);
    tb_tensor_release(t);
    tb_clear_error();
}

static int fuzz_idx_one(const uint8_t *data, size_t size) {
    static tb__crc32_tables tables;
    static bool tables_ready = false;
    static unsigned char inflated[IDX_MAX_INFLATED];
    size_t hcrc, start, used = 0, n;
    uint8_t *copy;
    fuzz_setup();
    if (!tables_ready) {
        tb__crc32_init(&tables);
        tables_ready = true;
    }
    idx_load_check("input.idx", data, size, inflated, "idx");
    if (size < 2 || data[0] != 0x1f || data[1] != 0x8b) return 0;
    start = idx_gzip_start(data, size, &hcrc);
    if (start == 0) return 0;
    copy = (uint8_t *)malloc(size);
    if (copy == NULL) return 0;
    memcpy(copy, data, size);
    if (hcrc != SIZE_MAX) {
        uint32_t crc = tb__crc32(&tables, 0, copy, hcrc);
        copy[hcrc] = (uint8_t)(crc & 0xff);
        copy[hcrc + 1] = (uint8_t)((crc >> 8) & 0xff);
    }
    n = idx_inflate(copy + start, size - start, inflated, &used);
    if (n != SIZE_MAX && size - start - used >= 8) {
        idx_put32(copy + start + used, tb__crc32(&tables, 0, inflated, n));
        idx_put32(copy + start + used + 4, (uint32_t)n);
    }
    if (memcmp(copy, data, size) != 0)
        idx_load_check("repaired.idx", copy, size, inflated, "idx with its checks repaired");
    free(copy);
    return 0;
}

#undef IDX_MAX_INFLATED

#ifndef TB_FUZZ_NO_ENTRY
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    return fuzz_idx_one(data, size);
}
#endif
