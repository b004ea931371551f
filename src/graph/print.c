/* ===========================================================================================
   Printing tensors: PyTorch's repr (torch/_tensor_str.py) with its default print options
   =========================================================================================== */

#define TB__PRINT_THRESHOLD 1000 /* more elements than this: summarise */
#define TB__PRINT_EDGE      3    /* elements shown at each end of a summarised dim */
#define TB__PRINT_LINE      80   /* line width */
#define TB__PRINT_INDENT    7    /* strlen("tensor(") */
#define TB__PRINT_TEXT      400  /* room for any element's text (%.4f of DBL_MAX: 314) */

/* The value being printed and PyTorch's _Formatter state for it. */
typedef struct tb__printer {
    tb_shape shape;
    const unsigned char *data;
    int64_t strides[TB_MAX_RANK];
    bool summarize;
    bool floating;
    bool int_mode;
    bool sci_mode;
    bool any_finite; /* a finite non-zero value was seen */
    double min_abs, max_abs;
    int width;
    tb__str *out;
} tb__printer;

static double tb__print_float_at(const tb__printer *p, int64_t index) {
    if (p->shape.dtype == TB_F32) {
        float f;
        memcpy(&f, p->data + (size_t)index * 4, 4);
        return (double)f;
    } else if (p->shape.dtype == TB_F16 || p->shape.dtype == TB_BF16) {
        uint16_t h;
        memcpy(&h, p->data + (size_t)index * 2, 2);
        return tb__half_to_f64(p->shape.dtype, h);
    } else {
        double v;
        memcpy(&v, p->data + (size_t)index * 8, 8);
        return v;
    }
}

static int64_t tb__print_int_at(const tb__printer *p, int64_t index) {
    int32_t i32;
    int64_t i64;
    switch (p->shape.dtype) {
    case TB_I32:
        memcpy(&i32, p->data + (size_t)index * 4, 4);
        return i32;
    case TB_I64:
        memcpy(&i64, p->data + (size_t)index * 8, 8);
        return i64;
    default: /* u8 and bool: one byte */
        return p->data[index];
    }
}

/* Python's '{:.4f}' / '{:.0f}' / '{:.4e}' of a double (mode 'f', '0', 'e'); non-finite values
   as Python writes them ("nan" never has a sign). Returns the length. */
static int tb__print_float_text(char *buf, size_t cap, double v, char mode) {
    if (v != v) return snprintf(buf, cap, "nan");
    if (v > DBL_MAX) return snprintf(buf, cap, "inf");
    if (v < -DBL_MAX) return snprintf(buf, cap, "-inf");
    if (mode == 'e') return snprintf(buf, cap, "%.4e", v);
    if (mode == '0') return snprintf(buf, cap, "%.0f", v);
    return snprintf(buf, cap, "%.4f", v);
}

/* One element as _Formatter.format writes it, padded on the left to the common width. */
static void tb__print_element(const tb__printer *p, int64_t index, char *buf, size_t cap) {
    char text[TB__PRINT_TEXT];
    int n, pad;
    if (p->floating) {
        double v = tb__print_float_at(p, index);
        if (p->sci_mode) {
            n = tb__print_float_text(text, sizeof text, v, 'e');
        } else if (p->int_mode) {
            n = tb__print_float_text(text, sizeof text, v, '0');
            if (v == v && v <= DBL_MAX && v >= -DBL_MAX) {
                text[n++] = '.';
                text[n] = '\0';
            }
        } else {
            n = tb__print_float_text(text, sizeof text, v, 'f');
        }
    } else if (p->shape.dtype == TB_BOOL) {
        n = snprintf(text, sizeof text, "%s", tb__print_int_at(p, index) ? "True" : "False");
    } else {
        n = snprintf(text, sizeof text, "%lld", (long long)tb__print_int_at(p, index));
    }
    if (n < 0) n = 0;
    if ((size_t)n >= sizeof text) n = (int)sizeof text - 1;
    pad = p->width > n ? p->width - n : 0;
    if ((size_t)(pad + n) >= cap) pad = 0; /* never: widths come from these same texts */
    memset(buf, ' ', (size_t)pad);
    memcpy(buf + pad, text, (size_t)n);
    buf[pad + n] = '\0';
}

/* Calls `fn` on the flat index of every element shown (all, or the edges when summarised), in
   row-major order. */
static void tb__print_visit(tb__printer *p, int32_t dim, int64_t offset,
                            void (*fn)(tb__printer *p, int64_t index)) {
    int64_t n, i;
    if (dim == p->shape.rank) {
        fn(p, offset);
        return;
    }
    n = p->shape.dims[dim];
    for (i = 0; i < n; ++i) {
        if (p->summarize && n > 2 * TB__PRINT_EDGE && i == TB__PRINT_EDGE) i = n - TB__PRINT_EDGE;
        tb__print_visit(p, dim + 1, offset + i * p->strides[dim], fn);
    }
}

/* First pass of _Formatter: the range of the finite non-zero floats and whether all are
   integers. */
static void tb__print_scan(tb__printer *p, int64_t index) {
    double v, a;
    if (!p->floating) return;
    v = tb__print_float_at(p, index);
    if (v != v || v > DBL_MAX || v < -DBL_MAX || v == 0) return;
    a = fabs(v);
    if (!p->any_finite || a < p->min_abs) p->min_abs = a;
    if (!p->any_finite || a > p->max_abs) p->max_abs = a;
    p->any_finite = true;
    if (v != ceil(v)) p->int_mode = false;
}

/* Second pass: the widest element. */
static void tb__print_measure(tb__printer *p, int64_t index) {
    char text[TB__PRINT_TEXT];
    int n;
    if (p->floating) {
        double v = tb__print_float_at(p, index);
        if (v != v || v > DBL_MAX || v < -DBL_MAX || v == 0) return;
        if (p->sci_mode)
            n = tb__print_float_text(text, sizeof text, v, 'e');
        else if (p->int_mode)
            n = tb__print_float_text(text, sizeof text, v, '0') + 1;
        else
            n = tb__print_float_text(text, sizeof text, v, 'f');
    } else {
        tb__print_element(p, index, text, sizeof text); /* width is 1 here: no padding */
        n = (int)strlen(text);
    }
    if (n > p->width) p->width = n;
}

static void tb__print_formatter(tb__printer *p) {
    p->floating = tb_dtype_is_float(p->shape.dtype);
    p->int_mode = true;
    p->sci_mode = false;
    p->any_finite = false;
    p->width = 1;
    tb__print_visit(p, 0, 0, tb__print_scan);
    if (p->floating && !p->any_finite) return;
    if (p->floating) {
        bool wide = p->max_abs / p->min_abs > 1000.0 || p->max_abs > 1.0e8;
        p->sci_mode = p->int_mode ? wide : (wide || p->min_abs < 1.0e-4);
    }
    tb__print_visit(p, 0, 0, tb__print_measure);
}

static void tb__print_spaces(tb__str *s, int count) {
    if (count > 0) tb__str_append(s, "%*s", count, "");
}

/* _tensor_str_with_formatter for the sub-tensor at `dim` starting at flat index `offset`. */
static void tb__print_emit(tb__printer *p, int32_t dim, int64_t offset, int indent) {
    char text[TB__PRINT_TEXT];
    int64_t n, i;
    int32_t rank = p->shape.rank, k;
    bool cut;
    if (rank == 0) {
        tb__print_element(p, 0, text, sizeof text);
        tb__str_append(p->out, "%s", text);
        return;
    }
    n = p->shape.dims[dim];
    cut = p->summarize && n > 2 * TB__PRINT_EDGE;
    tb__str_append(p->out, "[");
    if (dim == rank - 1) {
        int per_line = (TB__PRINT_LINE - indent) / (p->width + 2);
        int64_t item = 0;
        if (per_line < 1) per_line = 1;
        for (i = 0; i < n; ++i, ++item) {
            if (item > 0) {
                if (item % per_line == 0) {
                    tb__str_append(p->out, ",\n");
                    tb__print_spaces(p->out, indent + 1);
                } else {
                    tb__str_append(p->out, ", ");
                }
            }
            if (cut && i == TB__PRINT_EDGE) {
                tb__str_append(p->out, " ...");
                i = n - TB__PRINT_EDGE - 1;
                continue;
            }
            tb__print_element(p, offset + i * p->strides[dim], text, sizeof text);
            tb__str_append(p->out, "%s", text);
        }
    } else {
        for (i = 0; i < n; ++i) {
            if (i > 0) {
                tb__str_append(p->out, ",");
                for (k = 0; k < rank - dim - 1; ++k)
                    tb__str_append(p->out, "\n");
                tb__print_spaces(p->out, indent + 1);
            }
            if (cut && i == TB__PRINT_EDGE) {
                tb__str_append(p->out, "...");
                i = n - TB__PRINT_EDGE - 1;
                continue;
            }
            tb__print_emit(p, dim + 1, offset + i * p->strides[dim], indent + 1);
        }
    }
    tb__str_append(p->out, "]");
}

/* _add_suffixes: ", suffix", or a new line indented under the value when the line would pass
   the line width. `last_line` carries PyTorch's count (including its off-by-two start). */
static void tb__print_suffix(tb__str *s, size_t *last_line, const char *suffix) {
    size_t len = strlen(suffix);
    if (*last_line + len + 2 > TB__PRINT_LINE) {
        tb__str_append(s, ",\n%*s%s", TB__PRINT_INDENT, "", suffix);
        *last_line = TB__PRINT_INDENT + len;
    } else {
        tb__str_append(s, ", %s", suffix);
        *last_line += len + 2;
    }
}

/* The whole text into `s` (which the caller frees). */
static tb_status tb__print_tensor(const char *fn, tb_tensor *tensor, tb__str *s) {
    tb__printer p;
    tb_device device;
    char text[128], device_text[64];
    size_t nbytes = 0, last_line, i;
    int64_t numel = 0;
    void *host;
    tb_status st;
    tb__ensure_setup();
    if (tensor == NULL) {
        if (tb_last_status() != TB_OK) return tb_last_status();
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: tensor is NULL", fn);
    }
    memset(&p, 0, sizeof p);
    p.shape = tb_tensor_shape(tensor);
    device = tb_tensor_device(tensor);
    st = tb_shape_numel(&p.shape, &numel);
    if (st == TB_OK) st = tb_shape_nbytes(&p.shape, &nbytes);
    if (st != TB_OK) return st;
    host = tb__alloc(nbytes ? nbytes : 1);
    if (host == NULL) return tb_last_status();
    st = tb_tensor_to_host(tensor, host, nbytes);
    if (st != TB_OK) {
        tb__free(host);
        return st;
    }
    p.data = (const unsigned char *)host;
    p.out = s;
    tb_shape_strides(&p.shape, p.strides);
    tb__str_append(s, "tensor(");
    if (numel == 0) {
        tb__str_append(s, "[]");
    } else {
        p.summarize = numel > TB__PRINT_THRESHOLD;
        tb__print_formatter(&p);
        tb__print_emit(&p, 0, 0, TB__PRINT_INDENT);
    }
    tb__free(host);
    if (s->failed) return tb__error(TB_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    for (i = s->len; i > 0 && s->data[i - 1] != '\n'; --i)
        ;
    last_line = s->len - i + 2; /* PyTorch's len - rfind('\n') + 1 */
    tb_device_format(&device, device_text, sizeof device_text);
    snprintf(text, sizeof text, "device='%s'", device_text);
    tb__print_suffix(s, &last_line, text);
    if (numel == 0 && p.shape.rank != 1) {
        size_t n = (size_t)snprintf(text, sizeof text, "size=(");
        int32_t d;
        for (d = 0; d < p.shape.rank; ++d)
            n += (size_t)snprintf(text + n, sizeof text - n, "%s%lld", d ? ", " : "",
                                  (long long)p.shape.dims[d]);
        snprintf(text + n, sizeof text - n, ")");
        tb__print_suffix(s, &last_line, text);
    }
    snprintf(text, sizeof text, "dtype=%s", tb_dtype_name(p.shape.dtype));
    tb__print_suffix(s, &last_line, text);
    tb__str_append(s, ")");
    if (s->failed) return tb__error(TB_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    return TB_OK;
}

TBDEF tb_status tb_tensor_format(tb_tensor *tensor, char *buf, size_t cap, size_t *needed) {
    tb__str s;
    tb_status st;
    if (needed != NULL) *needed = 0;
    if (buf != NULL && cap > 0) buf[0] = '\0';
    if (buf == NULL && cap > 0) {
        tb__ensure_setup();
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_tensor_format: buf is NULL but cap is %lu",
                         (unsigned long)cap);
    }
    memset(&s, 0, sizeof s);
    st = tb__print_tensor("tb_tensor_format", tensor, &s);
    if (st == TB_OK) {
        if (cap > 0) {
            size_t n = s.len < cap - 1 ? s.len : cap - 1;
            memcpy(buf, s.data, n);
            buf[n] = '\0';
        }
        if (needed != NULL) *needed = s.len;
    }
    tb__str_free(&s);
    return st;
}

TBDEF tb_status tb_tensor_print(tb_tensor *tensor) {
    tb__str s;
    tb_status st;
    memset(&s, 0, sizeof s);
    st = tb__print_tensor("tb_tensor_print", tensor, &s);
    if (st == TB_OK && (fwrite(s.data, 1, s.len, stdout) != s.len || fputc('\n', stdout) == EOF ||
                        fflush(stdout) != 0))
        st = tb__error(TB_ERR_IO, "tb_tensor_print: cannot write to stdout: %s", strerror(errno));
    tb__str_free(&s);
    return st;
}

#undef TB__PRINT_THRESHOLD
#undef TB__PRINT_EDGE
#undef TB__PRINT_LINE
#undef TB__PRINT_INDENT
#undef TB__PRINT_TEXT
