/* ===========================================================================================
   Interop: .npy files
   =========================================================================================== */

#define TB__NPY_MAGIC_LEN 6
static const char tb__npy_magic[TB__NPY_MAGIC_LEN] = {'\x93', 'N', 'U', 'M', 'P', 'Y'};

static bool tb__host_is_little_endian(void) {
    const uint16_t probe = 1;
    unsigned char first;
    memcpy(&first, &probe, 1);
    return first == 1;
}

static void tb__swap_bytes(unsigned char *data, size_t count, size_t width) {
    for (size_t i = 0; i < count; ++i) {
        unsigned char *p = data + i * width;
        for (size_t a = 0, b = width - 1; a < b; ++a, --b) {
            unsigned char t = p[a];
            p[a] = p[b];
            p[b] = t;
        }
    }
}

/* The parsed header of a .npy file. */
typedef struct tb__npy_header {
    tb_dtype dtype;
    bool big_endian;
    bool fortran_order;
    int32_t rank;
    int64_t dims[TB_MAX_RANK];
    bool has_descr, has_order, has_shape;
} tb__npy_header;

typedef struct tb__npy_parser {
    const char *text;
    size_t len;
    size_t pos;
    const char *path;
} tb__npy_parser;

static void tb__npy_skip_space(tb__npy_parser *p) {
    while (p->pos < p->len && (p->text[p->pos] == ' ' || p->text[p->pos] == '\t' ||
                               p->text[p->pos] == '\n' || p->text[p->pos] == '\r'))
        p->pos++;
}

static bool tb__npy_accept(tb__npy_parser *p, char c) {
    tb__npy_skip_space(p);
    if (p->pos < p->len && p->text[p->pos] == c) {
        p->pos++;
        return true;
    }
    return false;
}

static tb_status tb__npy_bad(tb__npy_parser *p, const char *what) {
    return tb__error(TB_ERR_FORMAT, "tb_npy_load: %s: malformed header at byte %u: %s", p->path,
                     (unsigned)p->pos, what);
}

/* A Python string literal in single or double quotes, without escapes (numpy writes none). */
static tb_status tb__npy_string(tb__npy_parser *p, char *out, size_t cap) {
    tb__npy_skip_space(p);
    if (p->pos >= p->len || (p->text[p->pos] != '\'' && p->text[p->pos] != '"'))
        return tb__npy_bad(p, "expected a quoted string");
    char quote = p->text[p->pos++];
    size_t n = 0;
    while (p->pos < p->len && p->text[p->pos] != quote) {
        if (p->text[p->pos] == '\\' || n + 1 >= cap) return tb__npy_bad(p, "unexpected string");
        out[n++] = p->text[p->pos++];
    }
    if (p->pos >= p->len) return tb__npy_bad(p, "unterminated string");
    p->pos++;
    out[n] = '\0';
    return TB_OK;
}

static tb_status tb__npy_descr(tb__npy_parser *p, tb__npy_header *h) {
    char descr[16];
    tb_status st = tb__npy_string(p, descr, sizeof descr);
    if (st != TB_OK) return st;
    static const struct {
        const char *code;
        tb_dtype dtype;
    } table[] = {{"f4", TB_F32}, {"f8", TB_F64}, {"i4", TB_I32},
                 {"i8", TB_I64}, {"u1", TB_U8},  {"b1", TB_BOOL}};
    char order = descr[0];
    if (order != '<' && order != '>' && order != '|' && order != '=')
        return tb__error(TB_ERR_FORMAT, "tb_npy_load: %s: unsupported dtype '%s'", p->path, descr);
    for (size_t i = 0; i < sizeof table / sizeof table[0]; ++i) {
        if (strcmp(descr + 1, table[i].code) == 0) {
            h->dtype = table[i].dtype;
            h->big_endian = order == '>' || (order == '=' && !tb__host_is_little_endian());
            h->has_descr = true;
            return TB_OK;
        }
    }
    return tb__error(TB_ERR_FORMAT,
                     "tb_npy_load: %s: unsupported dtype '%s' (supported: f4 f8 i4 i8 u1 b1)",
                     p->path, descr);
}

static tb_status tb__npy_shape(tb__npy_parser *p, tb__npy_header *h) {
    if (!tb__npy_accept(p, '(')) return tb__npy_bad(p, "expected '(' for the shape");
    h->rank = 0;
    for (;;) {
        if (tb__npy_accept(p, ')')) break;
        tb__npy_skip_space(p);
        if (p->pos >= p->len || p->text[p->pos] < '0' || p->text[p->pos] > '9')
            return tb__npy_bad(p, "expected a dimension");
        int64_t value = 0;
        while (p->pos < p->len && p->text[p->pos] >= '0' && p->text[p->pos] <= '9') {
            int digit = p->text[p->pos++] - '0';
            if (value > (INT64_MAX - digit) / 10)
                return tb__error(TB_ERR_FORMAT, "tb_npy_load: %s: a dimension overflows int64",
                                 p->path);
            value = value * 10 + digit;
        }
        if (h->rank >= TB_MAX_RANK)
            return tb__error(TB_ERR_FORMAT, "tb_npy_load: %s: more than %d dimensions", p->path,
                             TB_MAX_RANK);
        h->dims[h->rank++] = value;
        if (tb__npy_accept(p, ')')) break;
        if (!tb__npy_accept(p, ',')) return tb__npy_bad(p, "expected ',' or ')' in the shape");
    }
    h->has_shape = true;
    return TB_OK;
}

static tb_status tb__npy_parse_header(const char *text, size_t len, const char *path,
                                      tb__npy_header *h) {
    tb__npy_parser p;
    p.text = text;
    p.len = len;
    p.pos = 0;
    p.path = path;
    memset(h, 0, sizeof *h);
    if (!tb__npy_accept(&p, '{')) return tb__npy_bad(&p, "expected '{'");
    while (!tb__npy_accept(&p, '}')) {
        char key[32];
        tb_status st = tb__npy_string(&p, key, sizeof key);
        if (st != TB_OK) return st;
        if (!tb__npy_accept(&p, ':')) return tb__npy_bad(&p, "expected ':'");
        if (strcmp(key, "descr") == 0 && !h->has_descr) {
            st = tb__npy_descr(&p, h);
        } else if (strcmp(key, "fortran_order") == 0 && !h->has_order) {
            tb__npy_skip_space(&p);
            if (p.len - p.pos >= 4 && memcmp(p.text + p.pos, "True", 4) == 0) {
                h->fortran_order = true;
                p.pos += 4;
            } else if (p.len - p.pos >= 5 && memcmp(p.text + p.pos, "False", 5) == 0) {
                p.pos += 5;
            } else {
                return tb__npy_bad(&p, "fortran_order must be True or False");
            }
            h->has_order = true;
        } else if (strcmp(key, "shape") == 0 && !h->has_shape) {
            st = tb__npy_shape(&p, h);
        } else {
            return tb__error(TB_ERR_FORMAT, "tb_npy_load: %s: unexpected or repeated key '%s'",
                             path, key);
        }
        if (st != TB_OK) return st;
        if (!tb__npy_accept(&p, ',')) {
            if (!tb__npy_accept(&p, '}')) return tb__npy_bad(&p, "expected ',' or '}'");
            break;
        }
    }
    if (!h->has_descr || !h->has_order || !h->has_shape)
        return tb__error(TB_ERR_FORMAT, "tb_npy_load: %s: header lacks %s", path,
                         !h->has_descr   ? "'descr'"
                         : !h->has_order ? "'fortran_order'"
                                         : "'shape'");
    if (h->fortran_order)
        return tb__error(TB_ERR_FORMAT,
                         "tb_npy_load: %s: Fortran-order arrays are not supported; save it in C "
                         "order (numpy.ascontiguousarray)",
                         path);
    return TB_OK;
}

/* Reads exactly `size` bytes; false on a short read. */
static bool tb__read_exact(FILE *f, void *dst, size_t size) {
    return size == 0 || fread(dst, 1, size, f) == size;
}

TBDEF tb_tensor *tb_npy_load(const char *path, const tb_device *device) {
    tb__ensure_setup();
    if (path == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "tb_npy_load: path is NULL");
        return NULL;
    }
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        tb__error(errno == ENOENT ? TB_ERR_NOT_FOUND : TB_ERR_IO, "tb_npy_load: cannot open %s: %s",
                  path, strerror(errno));
        return NULL;
    }
    tb_tensor *result = NULL;
    char *header_text = NULL;
    void *data = NULL;
    unsigned char preamble[12];
    tb__npy_header h;
    tb_shape shape;
    size_t nbytes = 0;
    unsigned major = 0;
    size_t header_len = 0;
    if (!tb__read_exact(f, preamble, 8) || memcmp(preamble, tb__npy_magic, TB__NPY_MAGIC_LEN)) {
        tb__error(TB_ERR_FORMAT, "tb_npy_load: %s is not a .npy file (bad magic)", path);
        goto done;
    }
    major = preamble[6];
    if (major == 1) {
        if (!tb__read_exact(f, preamble + 8, 2)) goto truncated;
        header_len = (size_t)preamble[8] | ((size_t)preamble[9] << 8);
    } else if (major == 2 || major == 3) {
        if (!tb__read_exact(f, preamble + 8, 4)) goto truncated;
        header_len = (size_t)preamble[8] | ((size_t)preamble[9] << 8) |
                     ((size_t)preamble[10] << 16) | ((size_t)preamble[11] << 24);
        if (header_len > ((size_t)1 << 24)) {
            tb__error(TB_ERR_FORMAT, "tb_npy_load: %s: header of %lu bytes is not plausible", path,
                      (unsigned long)header_len);
            goto done;
        }
    } else {
        tb__error(TB_ERR_FORMAT, "tb_npy_load: %s: unsupported format version %u.%u", path, major,
                  (unsigned)preamble[7]);
        goto done;
    }
    header_text = (char *)tb__alloc(header_len + 1);
    if (header_text == NULL) goto done;
    if (!tb__read_exact(f, header_text, header_len)) goto truncated;
    header_text[header_len] = '\0';
    if (tb__npy_parse_header(header_text, header_len, path, &h) != TB_OK) goto done;
    if (tb_shape_make(&shape, h.dtype, h.rank, h.dims) != TB_OK ||
        tb_shape_nbytes(&shape, &nbytes) != TB_OK) {
        tb__error(TB_ERR_FORMAT, "tb_npy_load: %s: the shape in the header is too large", path);
        goto done;
    }
    data = tb__alloc(nbytes ? nbytes : 1);
    if (data == NULL) goto done;
    if (!tb__read_exact(f, data, nbytes)) {
        tb__error(TB_ERR_FORMAT,
                  "tb_npy_load: %s: truncated: the header promises %lu bytes of data", path,
                  (unsigned long)nbytes);
        goto done;
    }
    if (fgetc(f) != EOF) {
        tb__error(TB_ERR_FORMAT,
                  "tb_npy_load: %s: data continues past the %lu bytes the header "
                  "describes",
                  path, (unsigned long)nbytes);
        goto done;
    }
    if (h.big_endian == tb__host_is_little_endian() && tb_dtype_size(h.dtype) > 1)
        tb__swap_bytes((unsigned char *)data, nbytes / tb_dtype_size(h.dtype),
                       tb_dtype_size(h.dtype));
    if (h.dtype == TB_BOOL) {
        unsigned char *b = (unsigned char *)data;
        for (size_t i = 0; i < nbytes; ++i)
            b[i] = b[i] != 0;
    }
    result = tb_tensor_from_host(data, &shape, device);
    goto done;
truncated:
    tb__error(TB_ERR_FORMAT, "tb_npy_load: %s: truncated header", path);
done:
    fclose(f);
    tb__free(header_text);
    tb__free(data);
    return result;
}

/* numpy's header text, padded with spaces so the data starts on a 64-byte boundary. */
static char *tb__npy_header_text(const tb_shape *shape, size_t *len, unsigned *major) {
    static const char *const codes[TB_DTYPE_COUNT] = {"<f4", "<f8", "<i4", "<i8", "|u1", "|b1"};
    tb__str s;
    memset(&s, 0, sizeof s);
    tb__str_append(&s, "{'descr': '%s', 'fortran_order': False, 'shape': (", codes[shape->dtype]);
    for (int32_t i = 0; i < shape->rank; ++i)
        tb__str_append(&s, "%lld%s", (long long)shape->dims[i],
                       shape->rank == 1 ? "," : (i + 1 < shape->rank ? ", " : ""));
    tb__str_append(&s, "), }");
    if (s.failed) {
        tb__str_free(&s);
        return NULL;
    }
    size_t body = s.len + 1; /* + '\n' */
    *major = body + 10 > 65535 ? 2 : 1;
    size_t preamble = *major == 1 ? 10 : 12;
    size_t padded = (preamble + body + 63) / 64 * 64 - preamble;
    while (s.len + 1 < padded)
        tb__str_append(&s, " ");
    tb__str_append(&s, "\n");
    *len = s.len;
    return tb__str_take(&s);
}

TBDEF tb_status tb_npy_save(const char *path, tb_tensor *tensor) {
    tb__ensure_setup();
    if (path == NULL || tensor == NULL)
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_npy_save: %s is NULL",
                         path == NULL ? "path" : "tensor");
    tb_shape shape = tb_tensor_shape(tensor);
    size_t nbytes = 0;
    tb_status st = tb_shape_nbytes(&shape, &nbytes);
    if (st != TB_OK) return st;
    void *data = tb__alloc(nbytes ? nbytes : 1);
    if (data == NULL) return TB_ERR_OUT_OF_MEMORY;
    st = tb_tensor_to_host(tensor, data, nbytes);
    if (st != TB_OK) {
        tb__free(data);
        return st;
    }
    if (!tb__host_is_little_endian() && tb_dtype_size(shape.dtype) > 1)
        tb__swap_bytes((unsigned char *)data, nbytes / tb_dtype_size(shape.dtype),
                       tb_dtype_size(shape.dtype));
    size_t header_len = 0;
    unsigned major = 1;
    char *header = tb__npy_header_text(&shape, &header_len, &major);
    char *tmp = tb__format("%s.tmp%lu", path, (unsigned long)tb__now_ns());
    if (header == NULL || tmp == NULL) {
        tb__free(data);
        tb__free(header);
        tb__free(tmp);
        return TB_ERR_OUT_OF_MEMORY;
    }
    unsigned char preamble[12];
    memcpy(preamble, tb__npy_magic, TB__NPY_MAGIC_LEN);
    preamble[6] = (unsigned char)major;
    preamble[7] = 0;
    size_t preamble_len = major == 1 ? 10 : 12;
    for (size_t i = 8; i < preamble_len; ++i)
        preamble[i] = (unsigned char)((header_len >> (8 * (i - 8))) & 0xff);
    FILE *f = fopen(tmp, "wb");
    bool ok = f != NULL;
    if (ok) {
        ok = fwrite(preamble, 1, preamble_len, f) == preamble_len &&
             fwrite(header, 1, header_len, f) == header_len &&
             (nbytes == 0 || fwrite(data, 1, nbytes, f) == nbytes);
        ok = (fclose(f) == 0) && ok;
    }
    if (ok && rename(tmp, path) != 0) ok = false;
    if (!ok) {
        st = tb__error(TB_ERR_IO, "tb_npy_save: cannot write %s: %s", path, strerror(errno));
        remove(tmp);
    }
    tb__free(data);
    tb__free(header);
    tb__free(tmp);
    return st;
}

#undef TB__NPY_MAGIC_LEN
