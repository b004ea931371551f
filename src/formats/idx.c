/* ===========================================================================================
   Model files: IDX (MNIST's format), plain or gzip.
   =========================================================================================== */

/* ---- IDX files (MNIST's format), plain or gzip ---- */

/* The magic (0x0000TTNN) and at most 255 dims of 4 bytes: the longest IDX header. */
#define TB__IDX_MAX_HEADER (4 + 4 * 255)

typedef struct tb__idx_type {
    uint8_t code;   /* TT of the magic */
    uint8_t width;  /* bytes per element in the file */
    tb_dtype dtype; /* what it loads as */
    const char *name;
} tb__idx_type;

static const tb__idx_type tb__idx_types[] = {{0x08, 1, TB_U8, "u8"},   {0x09, 1, TB_I32, "i8"},
                                             {0x0b, 2, TB_I32, "i16"}, {0x0c, 4, TB_I32, "i32"},
                                             {0x0d, 4, TB_F32, "f32"}, {0x0e, 8, TB_F64, "f64"}};

/* What an IDX header says. */
typedef struct tb__idx_header {
    const tb__idx_type *type;
    tb_shape shape;
    size_t header_len; /* 4 + 4 * rank */
    size_t count;      /* elements */
    size_t data_len;   /* count * type->width: the bytes after the header */
    char text[128];    /* "u8[10000,28,28]", for messages */
} tb__idx_header;

static uint32_t tb__be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

/* Parses the header at p[0, avail); `where` names what holds it in messages ("the file", "the
   decompressed data"). */
static tb_status tb__idx_parse_header(const char *fn, const char *path, const char *where,
                                      const unsigned char *p, size_t avail, tb__idx_header *h) {
    int64_t dims[TB_MAX_RANK];
    size_t i, n = 0, nbytes = 0;
    unsigned rank;
    memset(h, 0, sizeof *h);
    if (avail < 4)
        return tb__error(TB_ERR_FORMAT,
                         "%s: %s: truncated: %s holds %lu bytes, an IDX header needs at least 4",
                         fn, path, where, (unsigned long)avail);
    if (p[0] != 0 || p[1] != 0)
        return tb__error(TB_ERR_FORMAT,
                         "%s: %s is not an IDX file: its magic 0x%02x%02x%02x%02x does not start "
                         "with two zero bytes (0x0000TTNN: TT the type, NN the rank)",
                         fn, path, p[0], p[1], p[2], p[3]);
    for (i = 0; i < sizeof tb__idx_types / sizeof tb__idx_types[0]; ++i)
        if (tb__idx_types[i].code == p[2]) h->type = &tb__idx_types[i];
    if (h->type == NULL)
        return tb__error(TB_ERR_FORMAT,
                         "%s: %s: unknown IDX type code 0x%02x (known: 0x08 u8, 0x09 i8, 0x0B "
                         "i16, 0x0C i32, 0x0D f32, 0x0E f64)",
                         fn, path, p[2]);
    rank = p[3];
    if (rank == 0)
        return tb__error(TB_ERR_FORMAT, "%s: %s: rank 0 (an IDX file has at least one dimension)",
                         fn, path);
    if (rank > TB_MAX_RANK)
        return tb__error(TB_ERR_UNSUPPORTED, "%s: %s: %u dimensions; at most %d are supported", fn,
                         path, rank, TB_MAX_RANK);
    h->header_len = 4 + 4 * (size_t)rank;
    if (avail < h->header_len)
        return tb__error(TB_ERR_FORMAT,
                         "%s: %s: truncated header: %u dimensions need %lu bytes, %s holds %lu", fn,
                         path, rank, (unsigned long)h->header_len, where, (unsigned long)avail);
    n = (size_t)snprintf(h->text, sizeof h->text, "%s[", h->type->name);
    for (i = 0; i < rank; ++i) {
        dims[i] = (int64_t)tb__be32(p + 4 + 4 * i);
        n += (size_t)snprintf(h->text + n, sizeof h->text - n, "%s%lld", i ? "," : "",
                              (long long)dims[i]);
    }
    snprintf(h->text + n, sizeof h->text - n, "]");
    if (tb_shape_make(&h->shape, h->type->dtype, (int32_t)rank, dims) != TB_OK ||
        tb_shape_nbytes(&h->shape, &nbytes) != TB_OK) {
        char why[1024];
        snprintf(why, sizeof why, "%s", tb_last_error());
        return tb__error(TB_ERR_FORMAT, "%s: %s: the dims %s are too large (%s)", fn, path, h->text,
                         why);
    }
    /* the file's elements are never wider than the tensor's, so this does not overflow */
    h->count = nbytes / tb_dtype_size(h->type->dtype);
    h->data_len = h->count * h->type->width;
    if (h->data_len > SIZE_MAX - h->header_len - 8)
        return tb__error(TB_ERR_FORMAT, "%s: %s: the dims %s are too large for this machine", fn,
                         path, h->text);
    return TB_OK;
}

/* `count` big-endian elements of IDX type `code` at src as the loaded dtype's values in host
   order at dst; src may equal dst when the widths are equal (each element is read first). */
static void tb__idx_decode(unsigned char *dst, const unsigned char *src, size_t count,
                           uint8_t code) {
    size_t i;
    for (i = 0; i < count; ++i) {
        if (code == 0x09) {
            int32_t v = (int32_t)src[i] - (src[i] >= 0x80 ? 0x100 : 0);
            memcpy(dst + 4 * i, &v, 4);
        } else if (code == 0x0b) {
            uint32_t u = ((uint32_t)src[2 * i] << 8) | src[2 * i + 1];
            int32_t v = (int32_t)u - (u >= 0x8000 ? 0x10000 : 0);
            memcpy(dst + 4 * i, &v, 4);
        } else if (code == 0x0e) {
            uint64_t v = ((uint64_t)tb__be32(src + 8 * i) << 32) | tb__be32(src + 8 * i + 4);
            memcpy(dst + 8 * i, &v, 8);
        } else { /* 0x0c, 0x0d */
            uint32_t v = tb__be32(src + 4 * i);
            memcpy(dst + 4 * i, &v, 4);
        }
    }
}

/* The tensor of the data at `bytes` inside `blob`. `writable`: the blob's bytes are the
   loader's own (inflated), so values the width of the dtype are put in host order in place;
   on a device that shares host memory the tensor then uses the blob without a copy. */
static tb_tensor *tb__idx_tensor(tb__blob *blob, unsigned char *bytes, bool writable,
                                 const tb__idx_header *h, const tb_device *device) {
    const bool host_big = !tb__host_is_little_endian();
    size_t size = tb_dtype_size(h->type->dtype);
    unsigned char *values;
    tb__blob *converted;
    tb_tensor *t;
    if (h->type->code == 0x08) return tb__blob_tensor(blob, bytes, &h->shape, false, device);
    if (writable && h->type->width == size) {
        tb__idx_decode(bytes, bytes, h->count, h->type->code);
        return tb__blob_tensor(blob, bytes, &h->shape, host_big, device);
    }
    values = (unsigned char *)tb__alloc(h->count ? h->count * size : 1);
    converted = values != NULL ? tb__blob_owning(values, h->count * size) : NULL;
    if (converted == NULL) return NULL;
    tb__idx_decode(values, bytes, h->count, h->type->code);
    t = tb__blob_tensor(converted, values, &h->shape, host_big, device);
    tb__blob_release(converted);
    return t;
}

/* An uncompressed IDX file. */
static tb_tensor *tb__idx_plain(const char *path, tb__blob *blob, const tb_device *device) {
    static const char fn[] = "tb_idx_load";
    tb__idx_header h;
    size_t have;
    if (tb__idx_parse_header(fn, path, "the file", blob->data, blob->size, &h) != TB_OK)
        return NULL;
    have = blob->size - h.header_len;
    if (have < h.data_len) {
        tb__error(TB_ERR_FORMAT,
                  "%s: %s: truncated: the dims %s need %lu bytes of data, the file holds %lu", fn,
                  path, h.text, (unsigned long)h.data_len, (unsigned long)have);
        return NULL;
    }
    if (have > h.data_len) {
        tb__error(TB_ERR_FORMAT,
                  "%s: %s: %lu bytes of trailing data after the %lu that the dims %s describe", fn,
                  path, (unsigned long)(have - h.data_len), (unsigned long)h.data_len, h.text);
        return NULL;
    }
    return tb__idx_tensor(blob, blob->data + h.header_len, false, &h, device);
}

/* The start of the deflate data after a gzip member's header (RFC 1952), checking it. */
static tb_status tb__gzip_header(const char *path, const unsigned char *p, size_t n,
                                 const tb__crc32_tables *crc, size_t *start) {
    static const char fn[] = "tb_idx_load";
    const unsigned flags = n > 3 ? p[3] : 0;
    size_t pos = 10;
    if (n < 10)
        return tb__error(TB_ERR_FORMAT,
                         "%s: %s: truncated gzip header (%lu bytes; it has at least 10)", fn, path,
                         (unsigned long)n);
    if (p[2] != 8)
        return tb__error(TB_ERR_FORMAT,
                         "%s: %s: bad gzip header: compression method %u is not deflate (8)", fn,
                         path, (unsigned)p[2]);
    if (flags & 0xe0)
        return tb__error(TB_ERR_FORMAT,
                         "%s: %s: bad gzip header: reserved flag bits are set (flags 0x%02x)", fn,
                         path, flags);
    if (flags & 4) { /* FEXTRA: a 2-byte length, then that many bytes */
        size_t xlen;
        if (n - pos < 2)
            return tb__error(TB_ERR_FORMAT, "%s: %s: truncated gzip header (in the extra field)",
                             fn, path);
        xlen = tb__le16(p + pos);
        if (n - pos - 2 < xlen)
            return tb__error(TB_ERR_FORMAT,
                             "%s: %s: truncated gzip header: the extra field of %lu bytes runs "
                             "past the end of the file",
                             fn, path, (unsigned long)xlen);
        pos += 2 + xlen;
    }
    if (flags & 8) { /* FNAME, then FCOMMENT: NUL-terminated */
        const unsigned char *end = (const unsigned char *)memchr(p + pos, 0, n - pos);
        if (end == NULL)
            return tb__error(TB_ERR_FORMAT,
                             "%s: %s: truncated gzip header: the file name has no terminating "
                             "NUL",
                             fn, path);
        pos = (size_t)(end - p) + 1;
    }
    if (flags & 16) {
        const unsigned char *end = (const unsigned char *)memchr(p + pos, 0, n - pos);
        if (end == NULL)
            return tb__error(TB_ERR_FORMAT,
                             "%s: %s: truncated gzip header: the comment has no terminating NUL",
                             fn, path);
        pos = (size_t)(end - p) + 1;
    }
    if (flags & 2) { /* FHCRC: the low 16 bits of the CRC-32 of the header before it */
        uint32_t want;
        if (n - pos < 2)
            return tb__error(TB_ERR_FORMAT, "%s: %s: truncated gzip header (in the header CRC)", fn,
                             path);
        want = tb__crc32(crc, 0, p, pos) & 0xffffu;
        if (tb__le16(p + pos) != want)
            return tb__error(TB_ERR_FORMAT,
                             "%s: %s: bad gzip header: its CRC-16 is 0x%04x, the header gives "
                             "0x%04x",
                             fn, path, (unsigned)tb__le16(p + pos), (unsigned)want);
        pos += 2;
    }
    *start = pos;
    return TB_OK;
}

/* A gzip-compressed IDX file: the header is inflated first (into a small buffer) so that the
   data are inflated once, into a buffer of the size the dims give. */
static tb_tensor *tb__idx_gzip(const char *path, tb__blob *blob, const tb__crc32_tables *crc,
                               const tb_device *device) {
    static const char fn[] = "tb_idx_load";
    unsigned char head[TB__IDX_MAX_HEADER];
    const unsigned char *in, *trailer;
    size_t start = 0, in_len, total, pad, used;
    unsigned char *buffer, *out;
    tb__blob *inflated;
    tb__inflater s;
    tb__idx_header h;
    const char *why;
    tb_tensor *t;
    uint32_t crc_file, crc_data;
    if (tb__gzip_header(path, blob->data, blob->size, crc, &start) != TB_OK) return NULL;
    in = blob->data + start;
    in_len = blob->size - start;
    memset(&s, 0, sizeof s);
    s.in = in;
    s.in_len = in_len;
    s.out = head;
    s.out_len = sizeof head;
    why = tb__inflate(&s);
    if (why != NULL && !s.full && !s.done) {
        tb__error(TB_ERR_FORMAT, "%s: %s: corrupt or truncated gzip data: %s", fn, path, why);
        return NULL;
    }
    if (tb__idx_parse_header(fn, path, "the decompressed data", head, s.out_pos, &h) != TB_OK)
        return NULL;
    total = h.header_len + h.data_len;
    if (total / 1032 > in_len) {
        tb__error(TB_ERR_FORMAT,
                  "%s: %s: the dims %s need %lu bytes, more than deflate can give from the %lu "
                  "compressed bytes (at most 1032 times as many): truncated data or wrong dims",
                  fn, path, h.text, (unsigned long)total, (unsigned long)in_len);
        return NULL;
    }
    /* the data start 8-byte aligned, so that the tensor can use them in place */
    pad = (8 - h.header_len % 8) % 8;
    buffer = (unsigned char *)tb__alloc(pad + total);
    inflated = buffer != NULL ? tb__blob_owning(buffer, pad + total) : NULL;
    if (inflated == NULL) return NULL;
    out = buffer + pad;
    memset(&s, 0, sizeof s);
    s.in = in;
    s.in_len = in_len;
    s.out = out;
    s.out_len = total;
    why = tb__inflate(&s);
    if (why != NULL) {
        if (s.full)
            tb__error(TB_ERR_FORMAT,
                      "%s: %s: the decompressed data are longer than the %lu bytes that the dims "
                      "%s describe",
                      fn, path, (unsigned long)total, h.text);
        else if (s.done)
            tb__error(TB_ERR_FORMAT,
                      "%s: %s: truncated: the dims %s need %lu bytes, the decompressed data hold "
                      "%lu",
                      fn, path, h.text, (unsigned long)total, (unsigned long)s.out_pos);
        else
            tb__error(TB_ERR_FORMAT, "%s: %s: corrupt or truncated gzip data: %s", fn, path, why);
        tb__blob_release(inflated);
        return NULL;
    }
    /* the deflate data end with the byte holding their last bit; the trailer follows */
    used = s.in_pos + (size_t)s.pad - (size_t)(s.nbits / 8);
    if (in_len - used < 8) {
        tb__error(TB_ERR_FORMAT,
                  "%s: %s: truncated: the gzip trailer (CRC-32 and size, 8 bytes) has only %lu", fn,
                  path, (unsigned long)(in_len - used));
        tb__blob_release(inflated);
        return NULL;
    }
    trailer = in + used;
    if (in_len - used > 8) {
        const bool member = in_len - used >= 10 && trailer[8] == 0x1f && trailer[9] == 0x8b;
        tb__error(TB_ERR_FORMAT, "%s: %s: %lu bytes of trailing data after the gzip member%s", fn,
                  path, (unsigned long)(in_len - used - 8),
                  member ? " (a second member: concatenated gzip files are not supported)" : "");
        tb__blob_release(inflated);
        return NULL;
    }
    crc_file = tb__le32(trailer);
    crc_data = tb__crc32(crc, 0, out, total);
    if (crc_file != crc_data) {
        tb__error(TB_ERR_FORMAT,
                  "%s: %s: CRC-32 mismatch (the trailer says 0x%08lx, the data give 0x%08lx): "
                  "the file is corrupt",
                  fn, path, (unsigned long)crc_file, (unsigned long)crc_data);
        tb__blob_release(inflated);
        return NULL;
    }
    if (tb__le32(trailer + 4) != (uint32_t)total) {
        tb__error(TB_ERR_FORMAT,
                  "%s: %s: the gzip trailer's ISIZE is %lu but the data inflate to %lu bytes", fn,
                  path, (unsigned long)tb__le32(trailer + 4), (unsigned long)total);
        tb__blob_release(inflated);
        return NULL;
    }
    t = tb__idx_tensor(inflated, out + h.header_len, true, &h, device);
    tb__blob_release(inflated);
    return t;
}

TBDEF tb_tensor *tb_idx_load(const char *path, const tb_device *device) {
    static const char fn[] = "tb_idx_load";
    tb__blob *blob = NULL;
    tb__crc32_tables *crc = NULL;
    tb_tensor *t = NULL;
    tb_device dev;
    tb__ensure_setup();
    if (path == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: path is NULL", fn);
        return NULL;
    }
    if (tb__resolve_device(device, &dev) != TB_OK) {
        char why[1024];
        tb_status st = tb_last_status();
        snprintf(why, sizeof why, "%s", tb_last_error());
        tb__error(st, "%s: %s: %s", fn, path, why);
        return NULL;
    }
    if (tb__blob_open(fn, path, &blob) != TB_OK) return NULL;
    if (blob->size >= 2 && blob->data[0] == 0x1f && blob->data[1] == 0x8b) {
        crc = (tb__crc32_tables *)tb__alloc(sizeof *crc);
        if (crc != NULL) {
            tb__crc32_init(crc);
            t = tb__idx_gzip(path, blob, crc, &dev);
        }
    } else {
        t = tb__idx_plain(path, blob, &dev);
    }
    tb__free(crc);
    tb__blob_release(blob);
    return t;
}

#undef TB__IDX_MAX_HEADER

#undef TB__SET_NONE
