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
    } table[] = {{"f4", TB_F32}, {"f8", TB_F64},  {"i4", TB_I32}, {"i8", TB_I64},
                 {"u1", TB_U8},  {"b1", TB_BOOL}, {"f2", TB_F16}};
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
                     "tb_npy_load: %s: unsupported dtype '%s' (supported: f2 f4 f8 i4 i8 u1 b1)",
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
            int64_t digit = p->text[p->pos++] - '0';
            if (!tb__muladd_i64(value, 10, digit, &value))
                return tb__error(TB_ERR_FORMAT, "tb_npy_load: %s: a dimension overflows int64",
                                 p->path);
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

/* How many bytes the stream holds from its position on, through fseek and ftell (standard C,
   so no file descriptor is needed): false when that is unknown (a pipe; a file beyond what a
   long counts). The position is left where it was. */
static bool tb__stream_left(FILE *f, int64_t *left) {
    long here = ftell(f), end;
    if (here < 0 || fseek(f, 0, SEEK_END) != 0) return false;
    end = ftell(f);
    if (fseek(f, here, SEEK_SET) != 0 || end < here) return false;
    *left = (int64_t)end - (int64_t)here;
    return true;
}

#define TB__READ_CHUNK ((size_t)1 << 16)

/* Reads `size` bytes into a new buffer with one NUL byte after them, never allocating much more
   than the stream really holds: when `known`, `left` (the bytes the stream holds) is checked
   first; otherwise the buffer grows as the bytes arrive, doubling from 64 KiB. TB_ERR_FORMAT
   when the stream ends first (*got: the bytes that were there), TB_ERR_OUT_OF_MEMORY. The
   error message is the caller's to write; nothing is allocated on error. */
static tb_status tb__read_bounded(FILE *f, size_t size, bool known, int64_t left,
                                  unsigned char **out, size_t *got) {
    unsigned char *buf, *bigger;
    size_t have = 0, cap, n;
    *got = 0;
    if (known && (uint64_t)left < (uint64_t)size) {
        *got = (size_t)left;
        return TB_ERR_FORMAT;
    }
    if (size == SIZE_MAX) return TB_ERR_OUT_OF_MEMORY; /* no room for the NUL */
    cap = known || size < TB__READ_CHUNK ? size : TB__READ_CHUNK;
    buf = (unsigned char *)tb__alloc(cap + 1);
    if (buf == NULL) return TB_ERR_OUT_OF_MEMORY;
    while (have < size) {
        if (have == cap) {
            cap = cap > (size - cap) ? size : 2 * cap;
            bigger = (unsigned char *)tb__alloc(cap + 1);
            if (bigger == NULL) {
                tb__free(buf);
                return TB_ERR_OUT_OF_MEMORY;
            }
            memcpy(bigger, buf, have);
            tb__free(buf);
            buf = bigger;
        }
        n = fread(buf + have, 1, cap - have, f);
        have += n;
        if (n == 0) {
            tb__free(buf);
            *got = have;
            return TB_ERR_FORMAT;
        }
    }
    buf[size] = '\0';
    *out = buf;
    *got = size;
    return TB_OK;
}

#undef TB__READ_CHUNK

/* tb_npy_load on an open stream; `path` names it in messages. */
static tb_tensor *tb__npy_load_stream(FILE *f, const char *path, const tb_device *device) {
    tb_tensor *result = NULL;
    unsigned char *header_text = NULL, *data = NULL;
    unsigned char preamble[12];
    tb__npy_header h;
    tb_shape shape;
    size_t nbytes = 0, got = 0, preamble_len, header_len = 0;
    unsigned major;
    int64_t left = 0;
    bool known;
    tb_status st;
    if (fread(preamble, 1, 8, f) != 8 || memcmp(preamble, tb__npy_magic, TB__NPY_MAGIC_LEN)) {
        tb__error(TB_ERR_FORMAT, "tb_npy_load: %s is not a .npy file (bad magic)", path);
        return NULL;
    }
    major = preamble[6];
    if (major != 1 && major != 2 && major != 3) {
        tb__error(TB_ERR_FORMAT, "tb_npy_load: %s: unsupported format version %u.%u", path, major,
                  (unsigned)preamble[7]);
        return NULL;
    }
    preamble_len = major == 1 ? 10 : 12;
    if (fread(preamble + 8, 1, preamble_len - 8, f) != preamble_len - 8) {
        tb__error(TB_ERR_FORMAT, "tb_npy_load: %s: truncated header", path);
        return NULL;
    }
    header_len = (size_t)preamble[8] | ((size_t)preamble[9] << 8);
    if (major != 1) header_len |= ((size_t)preamble[10] << 16) | ((size_t)preamble[11] << 24);
    if (header_len > ((size_t)1 << 24)) {
        tb__error(TB_ERR_FORMAT, "tb_npy_load: %s: header of %lu bytes is not plausible", path,
                  (unsigned long)header_len);
        return NULL;
    }
    known = tb__stream_left(f, &left);
    st = tb__read_bounded(f, header_len, known, left, &header_text, &got);
    if (st == TB_ERR_FORMAT) {
        tb__error(TB_ERR_FORMAT,
                  "tb_npy_load: %s: truncated header (%lu bytes promised, %lu in the file)", path,
                  (unsigned long)header_len, (unsigned long)got);
    }
    if (st != TB_OK) return NULL;
    if (known) left -= (int64_t)header_len;
    if (tb__npy_parse_header((const char *)header_text, header_len, path, &h) != TB_OK) goto done;
    if (tb_shape_make(&shape, h.dtype, h.rank, h.dims) != TB_OK ||
        tb_shape_nbytes(&shape, &nbytes) != TB_OK) {
        tb__error(TB_ERR_FORMAT, "tb_npy_load: %s: the shape in the header is too large (%s)", path,
                  tb_last_error());
        goto done;
    }
    /* What the header claims is checked against what the file holds before anything of that
       size is allocated. */
    if (known && (uint64_t)left > (uint64_t)nbytes) {
        tb__error(TB_ERR_FORMAT,
                  "tb_npy_load: %s: data continues past the %lu bytes the header describes (the "
                  "file holds %lld)",
                  path, (unsigned long)nbytes, (long long)left);
        goto done;
    }
    st = tb__read_bounded(f, nbytes, known, left, &data, &got);
    if (st == TB_ERR_FORMAT) {
        tb__error(TB_ERR_FORMAT,
                  "tb_npy_load: %s: truncated: the header promises %lu bytes of data, the file "
                  "holds %lu",
                  path, (unsigned long)nbytes, (unsigned long)got);
    }
    if (st != TB_OK) goto done;
    if (!known && fgetc(f) != EOF) {
        tb__error(TB_ERR_FORMAT,
                  "tb_npy_load: %s: data continues past the %lu bytes the header describes", path,
                  (unsigned long)nbytes);
        goto done;
    }
    if (h.big_endian == tb__host_is_little_endian() && tb_dtype_size(h.dtype) > 1)
        tb__swap_bytes(data, nbytes / tb_dtype_size(h.dtype), tb_dtype_size(h.dtype));
    if (h.dtype == TB_BOOL) {
        for (size_t i = 0; i < nbytes; ++i)
            data[i] = data[i] != 0;
    }
    result = tb_tensor_from_host(data, &shape, device);
done:
    tb__free(header_text);
    tb__free(data);
    return result;
}

TBDEF tb_tensor *tb_npy_load(const char *path, const tb_device *device) {
    tb_tensor *result;
    FILE *f;
    tb__ensure_setup();
    if (path == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "tb_npy_load: path is NULL");
        return NULL;
    }
    f = fopen(path, "rb");
    if (f == NULL) {
        tb__error(errno == ENOENT ? TB_ERR_NOT_FOUND : TB_ERR_IO, "tb_npy_load: cannot open %s: %s",
                  path, strerror(errno));
        return NULL;
    }
    result = tb__npy_load_stream(f, path, device);
    fclose(f);
    return result;
}

/* numpy's header text, padded with spaces so the data starts on a 64-byte boundary. */
static char *tb__npy_header_text(const tb_shape *shape, size_t *len, unsigned *major) {
    /* bf16 has no numpy code: tb_npy_save refuses it before this */
    static const char *const codes[TB_DTYPE_COUNT] = {"<f4", "<f8", "<i4", "<i8",
                                                      "|u1", "|b1", "<f2", "<V2"};
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
    if (shape.dtype == TB_BF16)
        return tb__error(TB_ERR_DTYPE,
                         "tb_npy_save: %s: numpy has no bf16 dtype (cast to f32 or f16 first, or "
                         "use safetensors or DLPack)",
                         path);
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
    /* errno is read at the call that failed (fclose and rename may change it on success, and a
       short write need not set it) */
    errno = 0;
    FILE *f = fopen(tmp, "wb");
    bool ok = f != NULL;
    int err = ok ? 0 : errno;
    if (ok) {
        ok = fwrite(preamble, 1, preamble_len, f) == preamble_len &&
             fwrite(header, 1, header_len, f) == header_len &&
             (nbytes == 0 || fwrite(data, 1, nbytes, f) == nbytes);
        if (!ok) err = errno;
        if (fclose(f) != 0 && ok) {
            ok = false;
            err = errno;
        }
    }
    if (ok && rename(tmp, path) != 0) {
        ok = false;
        err = errno;
    }
    if (!ok) {
        st = tb__error(TB_ERR_IO, "tb_npy_save: cannot write %s: %s", path,
                       strerror(err != 0 ? err : EIO));
        remove(tmp);
    }
    tb__free(data);
    tb__free(header);
    tb__free(tmp);
    return st;
}

#undef TB__NPY_MAGIC_LEN

/* ===========================================================================================
   Interop: DLPack
   =========================================================================================== */

/* DLPack consumers compile against their own copy of the structs: the layout must match
   DLPack's, checked here where pointers are 8 bytes. */
typedef char
    tb__dl_layout_check[(sizeof(void *) != 8 ||
                         (sizeof(tb_dl_tensor) == 48 && offsetof(tb_dl_tensor, dtype) == 20 &&
                          offsetof(tb_dl_tensor, byte_offset) == 40 &&
                          sizeof(tb_dl_managed_tensor) == 64 &&
                          offsetof(tb_dl_managed_tensor_versioned, flags) == 24 &&
                          sizeof(tb_dl_managed_tensor_versioned) == 80))
                            ? 1
                            : -1];

static bool tb__dl_from_dtype(tb_dtype dtype, tb_dl_data_type *out) {
    static const uint8_t codes[TB_DTYPE_COUNT] = {TB_DL_FLOAT, TB_DL_FLOAT, TB_DL_INT,
                                                  TB_DL_INT,   TB_DL_UINT,  TB_DL_BOOL,
                                                  TB_DL_FLOAT, TB_DL_BFLOAT};
    if (!tb_dtype_is_valid(dtype)) return false;
    out->code = codes[dtype];
    out->bits = (uint8_t)(8 * tb_dtype_size(dtype));
    out->lanes = 1;
    return true;
}

static bool tb__dl_to_dtype(tb_dl_data_type type, tb_dtype *out) {
    int d;
    for (d = 0; d < (int)TB_DTYPE_COUNT; ++d) {
        tb_dl_data_type ours;
        tb__dl_from_dtype((tb_dtype)d, &ours);
        if (ours.code == type.code && ours.bits == type.bits) {
            *out = (tb_dtype)d;
            return true;
        }
    }
    return false;
}

static const char *tb__dl_device_type_name(int32_t type) {
    switch (type) {
    case TB_DL_CPU:
        return "CPU";
    case TB_DL_CUDA:
        return "CUDA";
    case TB_DL_CUDA_HOST:
        return "CUDAHost";
    case TB_DL_OPENCL:
        return "OpenCL";
    case TB_DL_VULKAN:
        return "Vulkan";
    case TB_DL_METAL:
        return "Metal";
    case TB_DL_VPI:
        return "VPI";
    case TB_DL_ROCM:
        return "ROCM";
    case TB_DL_ROCM_HOST:
        return "ROCMHost";
    case TB_DL_EXT_DEV:
        return "ExtDev";
    case TB_DL_CUDA_MANAGED:
        return "CUDAManaged";
    case TB_DL_ONEAPI:
        return "OneAPI";
    case TB_DL_WEBGPU:
        return "WebGPU";
    case TB_DL_HEXAGON:
        return "Hexagon";
    default:
        return "unknown";
    }
}

static const char *tb__dl_code_name(uint8_t code) {
    switch (code) {
    case TB_DL_INT:
        return "int";
    case TB_DL_UINT:
        return "uint";
    case TB_DL_FLOAT:
        return "float";
    case TB_DL_OPAQUE_HANDLE:
        return "opaque handle";
    case TB_DL_BFLOAT:
        return "bfloat";
    case TB_DL_COMPLEX:
        return "complex";
    case TB_DL_BOOL:
        return "bool";
    default:
        return "unknown";
    }
}

/* ---- export ---- */

/* One allocation per export: the managed struct handed out (one of the two), what keeps the
   buffer alive, and the shape and strides the struct points at. */
typedef struct tb__dl_export {
    tb_dl_managed_tensor managed;
    tb_dl_managed_tensor_versioned versioned;
    tb_backend_data *lent; /* the tensor's own buffer (a reference), or NULL */
    void *mapped;          /* lent's values mapped to the host (until the deleter), or NULL */
    void *copy;            /* a host copy (owned), or NULL */
    int64_t shape[TB_MAX_RANK];
    int64_t strides[TB_MAX_RANK];
} tb__dl_export;

static void tb__dl_export_free(tb__dl_export *e) {
    if (e->mapped != NULL) { /* a deleter leaves the caller's last error as it was */
        tb__saved_error saved;
        tb__error_save(&saved);
        if (tb__data_unmap_host(e->lent, e->mapped) != TB_OK)
            tb_log_message(TB_LOG_WARN, "DLPack: ending the mapping of an exported buffer: %s",
                           tb_last_error());
        tb__error_restore(&saved);
    }
    tb__data_release(e->lent);
    tb__free(e->copy);
    tb__free(e);
}

static void tb__dl_export_deleter(tb_dl_managed_tensor *self) {
    if (self != NULL) tb__dl_export_free((tb__dl_export *)self->manager_ctx);
}

static void tb__dl_export_deleter_versioned(tb_dl_managed_tensor_versioned *self) {
    if (self != NULL) tb__dl_export_free((tb__dl_export *)self->manager_ctx);
}

/* Syncs the tensor and fills e->managed.dl_tensor (shared by both export forms). */
static tb_status tb__dl_export_begin(const char *fn, tb_tensor *tensor, tb__dl_export **out) {
    tb_shape shape;
    tb_dl_data_type type;
    tb_backend_data *data;
    tb__dl_export *e;
    tb_dl_tensor *dl;
    void *host;
    size_t nbytes = 0;
    tb_status st;
    tb__ensure_setup();
    if (tensor == NULL) {
        /* keep the first error of a chain of ops that ends here */
        if (tb_last_status() != TB_OK) return tb_last_status();
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: tensor is NULL", fn);
    }
    shape = tb_tensor_shape(tensor);
    if (!tb__dl_from_dtype(shape.dtype, &type))
        return tb__error(TB_ERR_DTYPE, "%s: invalid dtype %d", fn, (int)shape.dtype);
    st = tb_shape_nbytes(&shape, &nbytes);
    if (st != TB_OK) return st;
    data = tb_tensor_data(tensor);
    if (data == NULL) {
        st = tb_last_status();
        return st != TB_OK ? st : tb__error(TB_ERR_INTERNAL, "%s: the tensor has no value", fn);
    }
    e = (tb__dl_export *)tb__calloc(1, sizeof *e);
    if (e == NULL) return tb_last_status();
    /* the buffer itself where the backend keeps host memory, or maps it there without a copy
       (an OpenCL device that shares the host's memory: mapped for reading until the deleter) */
    host = tb__host_data(data);
    if (host == NULL) host = e->mapped = tb__data_map_host(data);
    if (host != NULL) {
        tb__data_retain(data);
        data->tb__shared = true; /* the consumer reads it: no later result takes its buffer */
        e->lent = data;
    } else {
        e->copy = tb__alloc(nbytes ? nbytes : 1);
        st = e->copy != NULL ? tb_tensor_to_host(tensor, e->copy, nbytes) : tb_last_status();
        if (st != TB_OK) {
            tb__dl_export_free(e);
            return st;
        }
        host = e->copy;
    }
    tb_shape_strides(&shape, e->strides);
    memcpy(e->shape, shape.dims, sizeof e->shape);
    dl = &e->managed.dl_tensor;
    dl->data = host;
    dl->device.device_type = TB_DL_CPU;
    dl->device.device_id = 0;
    dl->ndim = shape.rank;
    dl->dtype = type;
    dl->shape = e->shape;
    dl->strides = e->strides;
    dl->byte_offset = 0;
    *out = e;
    return TB_OK;
}

TBDEF tb_status tb_dlpack_export(tb_tensor *tensor, tb_dl_managed_tensor **out) {
    tb__dl_export *e = NULL;
    tb_status st;
    if (out == NULL) {
        tb__ensure_setup();
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_dlpack_export: out is NULL");
    }
    st = tb__dl_export_begin("tb_dlpack_export", tensor, &e);
    if (st != TB_OK) return st;
    e->managed.manager_ctx = e;
    e->managed.deleter = tb__dl_export_deleter;
    *out = &e->managed;
    return TB_OK;
}

TBDEF tb_status tb_dlpack_export_versioned(tb_tensor *tensor,
                                           tb_dl_managed_tensor_versioned **out) {
    tb__dl_export *e = NULL;
    tb_status st;
    if (out == NULL) {
        tb__ensure_setup();
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_dlpack_export_versioned: out is NULL");
    }
    st = tb__dl_export_begin("tb_dlpack_export_versioned", tensor, &e);
    if (st != TB_OK) return st;
    e->versioned.version.major = TB_DLPACK_MAJOR_VERSION;
    e->versioned.version.minor = TB_DLPACK_MINOR_VERSION;
    e->versioned.manager_ctx = e;
    e->versioned.deleter = tb__dl_export_deleter_versioned;
    e->versioned.flags = e->lent != NULL ? TB_DLPACK_FLAG_READ_ONLY : TB_DLPACK_FLAG_IS_COPIED;
    e->versioned.dl_tensor = e->managed.dl_tensor;
    *out = &e->versioned;
    return TB_OK;
}

/* ---- import ---- */

static void tb__dl_call_deleter(void *context) {
    tb_dl_managed_tensor *managed = (tb_dl_managed_tensor *)context;
    if (managed->deleter != NULL) managed->deleter(managed);
}

static void tb__dl_call_deleter_versioned(void *context) {
    tb_dl_managed_tensor_versioned *managed = (tb_dl_managed_tensor_versioned *)context;
    if (managed->deleter != NULL) managed->deleter(managed);
}

/* Copies a strided array of `shape` into the contiguous `dst`. Its extent passed
   tb__dl_check_extent: every partial sum of the offsets lies inside it, so none overflows. */
static void tb__dl_gather(const tb_shape *shape, const unsigned char *base, const int64_t *strides,
                          unsigned char *dst) {
    size_t width = tb_dtype_size(shape->dtype);
    int64_t numel = tb__shape_numel(shape), index[TB_MAX_RANK], i;
    int32_t d;
    for (d = 0; d < shape->rank; ++d)
        index[d] = 0;
    for (i = 0; i < numel; ++i) {
        int64_t offset = 0;
        for (d = 0; d < shape->rank; ++d)
            offset += index[d] * strides[d];
        memcpy(dst + (size_t)i * width, base + (ptrdiff_t)offset * (ptrdiff_t)width, width);
        for (d = shape->rank - 1; d >= 0; --d) {
            if (++index[d] < shape->dims[d]) break;
            index[d] = 0;
        }
    }
}

/* Checks, before anything touches the data, that every element a DLPack tensor describes lies at
   a byte offset from `data` that fits in int64 (strides of any sign, byte_offset included) and
   that adding those offsets to the address does not wrap around. The producer vouches for the
   memory itself; what is checked here keeps the arithmetic on it defined. */
static tb_status tb__dl_check_extent(const char *fn, const tb_dl_tensor *dl, const tb_shape *shape,
                                     size_t width) {
    int64_t lo, hi, strides[TB_MAX_RANK];
    uintptr_t address = (uintptr_t)dl->data;
    int32_t d;
    if (dl->byte_offset > (uint64_t)INT64_MAX) {
        return tb__error(TB_ERR_OVERFLOW, "%s: byte_offset %llu does not fit in int64", fn,
                         (unsigned long long)dl->byte_offset);
    }
    lo = hi = (int64_t)dl->byte_offset;
    if (tb__shape_numel(shape) > 0) {
        if (dl->strides == NULL) {
            if (tb_shape_strides(shape, strides) != TB_OK) return tb_last_status();
        } else {
            memcpy(strides, dl->strides, (size_t)shape->rank * sizeof *strides);
        }
        for (d = 0; d < shape->rank; ++d) {
            int64_t span;
            if (shape->dims[d] == 1) continue; /* any stride: never multiplied by a nonzero index */
            if (!tb__mul_i64(shape->dims[d] - 1, strides[d], &span) ||
                !tb__mul_i64(span, (int64_t)width, &span)) {
                return tb__error(TB_ERR_OVERFLOW,
                                 "%s: stride %lld of dimension %d overflows (the byte offset of "
                                 "element %lld along it does not fit in int64)",
                                 fn, (long long)strides[d], (int)d,
                                 (long long)(shape->dims[d] - 1));
            }
            if (!tb__add_i64(span < 0 ? lo : hi, span, span < 0 ? &lo : &hi)) {
                return tb__error(TB_ERR_OVERFLOW,
                                 "%s: the strides overflow: with stride %lld of dimension %d the "
                                 "byte offset of the %s element does not fit in int64",
                                 fn, (long long)strides[d], (int)d, span < 0 ? "first" : "last");
            }
        }
        if (!tb__add_i64(hi, (int64_t)width, &hi)) {
            return tb__error(TB_ERR_OVERFLOW,
                             "%s: the strides overflow: the end of the last element does not fit "
                             "in int64",
                             fn);
        }
    }
    /* The addresses data + lo .. data + hi, without wrapping around. */
    if ((lo < 0 && address < (uintptr_t)(0 - (uint64_t)lo)) ||
        (hi > 0 && (uint64_t)hi > (uint64_t)(UINTPTR_MAX - address))) {
        return tb__error(TB_ERR_OVERFLOW,
                         "%s: data %p with byte_offset %llu and these strides reaches bytes "
                         "%lld..%lld, outside the address space",
                         fn, dl->data, (unsigned long long)dl->byte_offset, (long long)lo,
                         (long long)hi);
    }
    return TB_OK;
}

/* The tensor of a DLPack tensor. `release(context)` runs the producer's deleter: once the last
   use of a borrowed buffer ends, or before returning after a copy; never on error. */
static tb_tensor *tb__dl_import(const char *fn, const tb_dl_tensor *dl, const tb_device *device,
                                void (*release)(void *context), void *context) {
    tb_shape shape;
    tb_dtype dtype;
    size_t nbytes = 0, width, i;
    const unsigned char *base;
    bool contiguous = true, in_place;
    tb_tensor *t;
    int64_t expected = 1;
    int32_t d;
    char text[96];
    if (dl->device.device_type != TB_DL_CPU) {
        tb__error(TB_ERR_UNSUPPORTED,
                  "%s: device type %d (%s) is not supported; only CPU (1) memory is imported", fn,
                  (int)dl->device.device_type, tb__dl_device_type_name(dl->device.device_type));
        return NULL;
    }
    if (dl->dtype.lanes != 1) {
        tb__error(TB_ERR_DTYPE, "%s: dtype with %u lanes is not supported (lanes must be 1)", fn,
                  (unsigned)dl->dtype.lanes);
        return NULL;
    }
    if (!tb__dl_to_dtype(dl->dtype, &dtype)) {
        tb__error(TB_ERR_DTYPE,
                  "%s: dtype code %u (%s) with %u bits is not supported (supported: float 32 "
                  "and 64, int 32 and 64, uint 8, bool 8)",
                  fn, (unsigned)dl->dtype.code, tb__dl_code_name(dl->dtype.code),
                  (unsigned)dl->dtype.bits);
        return NULL;
    }
    if (dl->ndim < 0 || dl->ndim > TB_MAX_RANK) {
        tb__error(TB_ERR_SHAPE, "%s: ndim %d is outside 0..%d", fn, (int)dl->ndim, TB_MAX_RANK);
        return NULL;
    }
    if (dl->ndim > 0 && dl->shape == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: shape is NULL for ndim %d", fn, (int)dl->ndim);
        return NULL;
    }
    for (d = 0; d < dl->ndim; ++d) {
        if (dl->shape[d] < 0) {
            tb__error(TB_ERR_SHAPE, "%s: dimension %d is %lld", fn, (int)d,
                      (long long)dl->shape[d]);
            return NULL;
        }
    }
    if (tb_shape_make(&shape, dtype, dl->ndim, dl->shape) != TB_OK ||
        tb_shape_nbytes(&shape, &nbytes) != TB_OK) {
        tb__error(TB_ERR_OVERFLOW, "%s: the tensor's size overflows (ndim %d)", fn, (int)dl->ndim);
        return NULL;
    }
    if (nbytes > 0 && dl->data == NULL) {
        tb__shape_text(&shape, text);
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: data is NULL for %s", fn, text);
        return NULL;
    }
    width = tb_dtype_size(dtype);
    if (tb__dl_check_extent(fn, dl, &shape, width) != TB_OK) return NULL;
    base = (const unsigned char *)dl->data;
    if (base != NULL) base += (size_t)dl->byte_offset; /* checked: no wrap */
    /* Dims of size 1 may have any stride (PyTorch exports such); empty arrays are contiguous. */
    if (dl->strides != NULL && nbytes > 0) {
        for (d = shape.rank - 1; d >= 0; --d) {
            if (shape.dims[d] != 1 && dl->strides[d] != expected) contiguous = false;
            expected *= shape.dims[d]; /* fits: the size rule of shapes */
        }
    }
    in_place = contiguous && ((uintptr_t)base % width) == 0;
    /* The library's bool tensors hold 0 or 1 per byte: other bytes need the copy's fix-up. */
    for (i = 0; in_place && dtype == TB_BOOL && i < nbytes; ++i)
        in_place = base[i] <= 1;
    if (in_place) {
        /* A device that cannot use host memory in place copies, and the producer's buffer is
           released at once; on failure the caller keeps it. */
        return tb__tensor_borrow(fn, base, &shape, device, release, context);
    } else {
        unsigned char *copy = (unsigned char *)tb__alloc(nbytes ? nbytes : 1);
        if (copy == NULL) return NULL;
        if (contiguous)
            memcpy(copy, base, nbytes);
        else
            tb__dl_gather(&shape, base, dl->strides, copy);
        if (dtype == TB_BOOL)
            for (i = 0; i < nbytes; ++i)
                copy[i] = copy[i] != 0;
        t = tb_tensor_from_host(copy, &shape, device);
        tb__free(copy);
        if (t == NULL) return NULL;
        release(context);
        return t;
    }
}

TBDEF tb_tensor *tb_dlpack_import(tb_dl_managed_tensor *managed, const tb_device *device) {
    tb__ensure_setup();
    if (managed == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "tb_dlpack_import: managed is NULL");
        return NULL;
    }
    return tb__dl_import("tb_dlpack_import", &managed->dl_tensor, device, tb__dl_call_deleter,
                         managed);
}

TBDEF tb_tensor *tb_dlpack_import_versioned(tb_dl_managed_tensor_versioned *managed,
                                            const tb_device *device) {
    tb__ensure_setup();
    if (managed == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "tb_dlpack_import_versioned: managed is NULL");
        return NULL;
    }
    if (managed->version.major != TB_DLPACK_MAJOR_VERSION) {
        tb__error(TB_ERR_UNSUPPORTED,
                  "tb_dlpack_import_versioned: DLPack major version %u is not supported (this "
                  "library reads version %d)",
                  (unsigned)managed->version.major, TB_DLPACK_MAJOR_VERSION);
        return NULL;
    }
    return tb__dl_import("tb_dlpack_import_versioned", &managed->dl_tensor, device,
                         tb__dl_call_deleter_versioned, managed);
}
