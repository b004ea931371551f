/* ===========================================================================================
   Model files: safetensors (an 8-byte length, a JSON header, then the tensors' bytes), loaded
   and saved.
   =========================================================================================== */

/* ---- safetensors ---- */

#define TB__ST_MAX_HEADER  100000000u /* the reference implementation's limit, in bytes */
#define TB__JSON_MAX_DEPTH 64

/* A JSON text (the safetensors header) being read; errors name the byte in the file. */
typedef struct tb__json {
    const char *text;
    size_t len;
    size_t pos;
    const char *fn;
    const char *path;
} tb__json;

static tb_status tb__json_fail(const tb__json *j, const char *what) {
    return tb__error(TB_ERR_FORMAT, "%s: %s: bad JSON header at byte %lu: %s", j->fn, j->path,
                     (unsigned long)(8 + j->pos), what);
}

static void tb__json_space(tb__json *j) {
    while (j->pos < j->len && (j->text[j->pos] == ' ' || j->text[j->pos] == '\t' ||
                               j->text[j->pos] == '\n' || j->text[j->pos] == '\r'))
        j->pos++;
}

static bool tb__json_accept(tb__json *j, char c) {
    tb__json_space(j);
    if (j->pos < j->len && j->text[j->pos] == c) {
        j->pos++;
        return true;
    }
    return false;
}

static int tb__json_hex4(const char *s) {
    int v = 0, i;
    for (i = 0; i < 4; ++i) {
        char c = s[i];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

/* A string, decoded into a new allocation *out (its length in *out_len; it may hold NUL bytes
   from \u0000), or only checked when out is NULL. The text was checked to be UTF-8. */
static tb_status tb__json_string(tb__json *j, char **out, size_t *out_len) {
    size_t end, n = 0;
    char *buf = NULL;
    tb__json_space(j);
    if (j->pos >= j->len || j->text[j->pos] != '"') return tb__json_fail(j, "expected a string");
    end = ++j->pos;
    while (end < j->len && j->text[end] != '"')
        end += j->text[end] == '\\' ? 2 : 1;
    if (end >= j->len) return tb__json_fail(j, "unterminated string");
    if (out != NULL) {
        buf = (char *)tb__alloc(end - j->pos + 1); /* decoding never lengthens the text */
        if (buf == NULL) return tb_last_status();
    }
    while (j->pos < end) {
        unsigned char c = (unsigned char)j->text[j->pos];
        uint32_t cp;
        if (c < 0x20) {
            tb__free(buf);
            return tb__json_fail(j, "control character in a string");
        }
        if (c != '\\') {
            if (buf != NULL) buf[n] = (char)c;
            n++;
            j->pos++;
            continue;
        }
        c = (unsigned char)j->text[++j->pos]; /* before `end`: the scan skipped escapes */
        switch (c) {
        case '"':
        case '\\':
        case '/':
            cp = c;
            break;
        case 'b':
            cp = 8;
            break;
        case 'f':
            cp = 12;
            break;
        case 'n':
            cp = 10;
            break;
        case 'r':
            cp = 13;
            break;
        case 't':
            cp = 9;
            break;
        case 'u': {
            int hi = j->pos + 4 < end ? tb__json_hex4(j->text + j->pos + 1) : -1;
            if (hi < 0) {
                tb__free(buf);
                return tb__json_fail(j, "\\u needs four hex digits");
            }
            cp = (uint32_t)hi;
            j->pos += 4;
            if (cp >= 0xdc00 && cp <= 0xdfff) {
                tb__free(buf);
                return tb__json_fail(j, "lone low surrogate");
            }
            if (cp >= 0xd800 && cp <= 0xdbff) {
                int lo =
                    j->pos + 6 < end && j->text[j->pos + 1] == '\\' && j->text[j->pos + 2] == 'u'
                        ? tb__json_hex4(j->text + j->pos + 3)
                        : -1;
                if (lo < 0xdc00 || lo > 0xdfff) {
                    tb__free(buf);
                    return tb__json_fail(j, "high surrogate without a low one");
                }
                cp = 0x10000 + ((cp - 0xd800) << 10) + ((uint32_t)lo - 0xdc00);
                j->pos += 6;
            }
            break;
        }
        default:
            tb__free(buf);
            return tb__json_fail(j, "bad escape in a string");
        }
        j->pos++;
        if (buf != NULL) { /* UTF-8 of cp: never longer than its escape */
            if (cp < 0x80) {
                buf[n] = (char)cp;
            } else if (cp < 0x800) {
                buf[n] = (char)(0xc0 | (cp >> 6));
                buf[++n] = (char)(0x80 | (cp & 0x3f));
            } else if (cp < 0x10000) {
                buf[n] = (char)(0xe0 | (cp >> 12));
                buf[++n] = (char)(0x80 | ((cp >> 6) & 0x3f));
                buf[++n] = (char)(0x80 | (cp & 0x3f));
            } else {
                buf[n] = (char)(0xf0 | (cp >> 18));
                buf[++n] = (char)(0x80 | ((cp >> 12) & 0x3f));
                buf[++n] = (char)(0x80 | ((cp >> 6) & 0x3f));
                buf[++n] = (char)(0x80 | (cp & 0x3f));
            }
        } else {
            n += cp < 0x80 ? 0 : cp < 0x800 ? 1 : cp < 0x10000 ? 2 : 3;
        }
        n++;
    }
    j->pos = end + 1;
    if (buf != NULL) {
        buf[n] = '\0';
        *out = buf;
    }
    if (out_len != NULL) *out_len = n;
    return TB_OK;
}

/* A non-negative integer up to INT64_MAX, without fraction or exponent. */
static tb_status tb__json_uint(tb__json *j, uint64_t *out) {
    uint64_t v = 0;
    size_t start;
    tb__json_space(j);
    start = j->pos;
    if (j->pos < j->len && j->text[j->pos] == '-') return tb__json_fail(j, "negative number");
    while (j->pos < j->len && j->text[j->pos] >= '0' && j->text[j->pos] <= '9') {
        unsigned d = (unsigned)(j->text[j->pos] - '0');
        if (v > ((uint64_t)INT64_MAX - d) / 10) return tb__json_fail(j, "number too large");
        v = v * 10 + d;
        j->pos++;
    }
    if (j->pos == start) return tb__json_fail(j, "expected a non-negative integer");
    if (j->pos - start > 1 && j->text[start] == '0') return tb__json_fail(j, "leading zero");
    if (j->pos < j->len &&
        (j->text[j->pos] == '.' || j->text[j->pos] == 'e' || j->text[j->pos] == 'E'))
        return tb__json_fail(j, "expected an integer, not a fraction");
    *out = v;
    return TB_OK;
}

/* Checks and skips any JSON value; `depth` counts the containers around it (a container may
   be opened while fewer than TB__JSON_MAX_DEPTH are open). */
static tb_status tb__json_skip(tb__json *j, int depth) {
    tb_status st;
    char c;
    tb__json_space(j);
    if (j->pos >= j->len) return tb__json_fail(j, "expected a value");
    c = j->text[j->pos];
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        if (depth >= TB__JSON_MAX_DEPTH) return tb__json_fail(j, "nested deeper than 64 levels");
        j->pos++;
        if (tb__json_accept(j, close)) return TB_OK;
        for (;;) {
            if (c == '{') {
                st = tb__json_string(j, NULL, NULL);
                if (st != TB_OK) return st;
                if (!tb__json_accept(j, ':')) return tb__json_fail(j, "expected ':'");
            }
            st = tb__json_skip(j, depth + 1);
            if (st != TB_OK) return st;
            if (tb__json_accept(j, close)) return TB_OK;
            if (!tb__json_accept(j, ','))
                return tb__json_fail(j, "expected ',' or a closing bracket");
        }
    }
    if (c == '"') return tb__json_string(j, NULL, NULL);
    if (c == 't' || c == 'f' || c == 'n') {
        const char *word = c == 't' ? "true" : c == 'f' ? "false" : "null";
        size_t n = strlen(word);
        if (j->len - j->pos < n || memcmp(j->text + j->pos, word, n) != 0)
            return tb__json_fail(j, "expected a value");
        j->pos += n;
        return TB_OK;
    }
    if (c == '-' || (c >= '0' && c <= '9')) { /* JSON's number grammar */
        size_t digits;
        if (c == '-') j->pos++;
        for (digits = 0; j->pos < j->len && j->text[j->pos] >= '0' && j->text[j->pos] <= '9';
             ++digits)
            j->pos++;
        if (digits == 0) return tb__json_fail(j, "bad number");
        if (digits > 1 && j->text[j->pos - digits] == '0') return tb__json_fail(j, "leading zero");
        if (j->pos < j->len && j->text[j->pos] == '.') {
            j->pos++;
            for (digits = 0; j->pos < j->len && j->text[j->pos] >= '0' && j->text[j->pos] <= '9';
                 ++digits)
                j->pos++;
            if (digits == 0) return tb__json_fail(j, "bad number");
        }
        if (j->pos < j->len && (j->text[j->pos] == 'e' || j->text[j->pos] == 'E')) {
            j->pos++;
            if (j->pos < j->len && (j->text[j->pos] == '+' || j->text[j->pos] == '-')) j->pos++;
            for (digits = 0; j->pos < j->len && j->text[j->pos] >= '0' && j->text[j->pos] <= '9';
                 ++digits)
                j->pos++;
            if (digits == 0) return tb__json_fail(j, "bad number");
        }
        return TB_OK;
    }
    return tb__json_fail(j, "expected a value");
}

/* The safetensors dtypes the library reads and writes. */
typedef struct tb__st_dtype {
    const char *name;
    tb_dtype dtype;
    uint8_t width; /* bytes per element in the file */
} tb__st_dtype;

static const tb__st_dtype tb__st_dtypes[] = {
    {"F64", TB_F64, 8}, {"F32", TB_F32, 4}, {"F16", TB_F16, 2}, {"BF16", TB_BF16, 2},
    {"I64", TB_I64, 8}, {"I32", TB_I32, 4}, {"U8", TB_U8, 1},   {"BOOL", TB_BOOL, 1},
};

/* The safetensors name of a library dtype; NULL for one it cannot hold. */
static const char *tb__st_dtype_name(tb_dtype dtype) {
    switch (dtype) {
    case TB_F32:
        return "F32";
    case TB_F64:
        return "F64";
    case TB_I32:
        return "I32";
    case TB_I64:
        return "I64";
    case TB_U8:
        return "U8";
    case TB_BOOL:
        return "BOOL";
    case TB_F16:
        return "F16";
    case TB_BF16:
        return "BF16";
    default:
        return NULL;
    }
}

/* One tensor of the header. The shape is parsed again (from shape_pos) when the tensor is made,
   which keeps this small: the entries never take more memory than the header's text. */
typedef struct tb__st_entry {
    char *name;
    size_t shape_pos;
    uint64_t begin, end;
    uint8_t dtype; /* index in tb__st_dtypes */
} tb__st_entry;

/* "[d0, d1, ...]" into dims; more than TB_MAX_RANK dims is TB_ERR_UNSUPPORTED. */
static tb_status tb__st_shape(tb__json *j, const char *name, int64_t dims[TB_MAX_RANK],
                              int32_t *rank) {
    *rank = 0;
    if (!tb__json_accept(j, '[')) return tb__json_fail(j, "'shape' must be a list of integers");
    if (tb__json_accept(j, ']')) return TB_OK;
    for (;;) {
        uint64_t d;
        tb_status st = tb__json_uint(j, &d);
        if (st != TB_OK) return st;
        if (*rank == TB_MAX_RANK)
            return tb__error(TB_ERR_UNSUPPORTED,
                             "%s: %s: tensor '%.200s' has more than %d dimensions, the most the "
                             "library supports",
                             j->fn, j->path, name, TB_MAX_RANK);
        dims[(*rank)++] = (int64_t)d;
        if (tb__json_accept(j, ']')) return TB_OK;
        if (!tb__json_accept(j, ',')) return tb__json_fail(j, "expected ',' or ']' in 'shape'");
    }
}

/* One tensor's object: dtype, shape, data_offsets (other keys are skipped, as the reference
   implementation does), checked against each other. */
static tb_status tb__st_tensor_entry(tb__json *j, tb__st_entry *e) {
    bool has_dtype = false, has_shape = false, has_offsets = false;
    int64_t dims[TB_MAX_RANK];
    int32_t rank = 0, d;
    uint64_t numel = 1, need;
    tb_status st = TB_OK;
    if (!tb__json_accept(j, '{')) return tb__json_fail(j, "a tensor's entry must be an object");
    if (!tb__json_accept(j, '}')) {
        for (;;) {
            char *key = NULL;
            st = tb__json_string(j, &key, NULL);
            if (st != TB_OK) return st;
            if (!tb__json_accept(j, ':')) {
                tb__free(key);
                return tb__json_fail(j, "expected ':'");
            }
            if ((strcmp(key, "dtype") == 0 && has_dtype) ||
                (strcmp(key, "shape") == 0 && has_shape) ||
                (strcmp(key, "data_offsets") == 0 && has_offsets)) {
                st = tb__error(TB_ERR_FORMAT, "%s: %s: tensor '%.200s' has '%s' twice", j->fn,
                               j->path, e->name, key);
            } else if (strcmp(key, "dtype") == 0) {
                char *name = NULL;
                size_t i, n = sizeof tb__st_dtypes / sizeof tb__st_dtypes[0];
                has_dtype = true;
                st = tb__json_string(j, &name, NULL);
                for (i = 0; st == TB_OK && i < n && strcmp(name, tb__st_dtypes[i].name) != 0; ++i)
                    ;
                if (st == TB_OK && i == n)
                    st = tb__error(TB_ERR_DTYPE,
                                   "%s: %s: tensor '%.200s' has dtype '%.32s', which the library "
                                   "does not read (it reads F64 F32 F16 BF16 I64 I32 U8 BOOL)",
                                   j->fn, j->path, e->name, name);
                e->dtype = (uint8_t)i;
                tb__free(name);
            } else if (strcmp(key, "shape") == 0) {
                has_shape = true;
                tb__json_space(j);
                e->shape_pos = j->pos;
                st = tb__st_shape(j, e->name, dims, &rank);
            } else if (strcmp(key, "data_offsets") == 0) {
                has_offsets = true;
                if (!tb__json_accept(j, '['))
                    st = tb__json_fail(j, "'data_offsets' must be [begin, end]");
                if (st == TB_OK) st = tb__json_uint(j, &e->begin);
                if (st == TB_OK && !tb__json_accept(j, ','))
                    st = tb__json_fail(j, "'data_offsets' must be [begin, end]");
                if (st == TB_OK) st = tb__json_uint(j, &e->end);
                if (st == TB_OK && !tb__json_accept(j, ']'))
                    st = tb__json_fail(j, "'data_offsets' must be [begin, end]");
            } else {
                st = tb__json_skip(j, 2); /* inside the header's and the tensor's objects */
            }
            tb__free(key);
            if (st != TB_OK) return st;
            if (tb__json_accept(j, '}')) break;
            if (!tb__json_accept(j, ',')) return tb__json_fail(j, "expected ',' or '}'");
        }
    }
    if (!has_dtype || !has_shape || !has_offsets)
        return tb__error(TB_ERR_FORMAT, "%s: %s: tensor '%.200s' lacks '%s'", j->fn, j->path,
                         e->name,
                         !has_dtype   ? "dtype"
                         : !has_shape ? "shape"
                                      : "data_offsets");
    if (e->begin > e->end)
        return tb__error(TB_ERR_FORMAT, "%s: %s: tensor '%.200s' has data_offsets [%llu, %llu]",
                         j->fn, j->path, e->name, (unsigned long long)e->begin,
                         (unsigned long long)e->end);
    for (d = 0; d < rank; ++d) {
        if (dims[d] != 0 && numel > (uint64_t)INT64_MAX / 8 / (uint64_t)dims[d])
            return tb__error(TB_ERR_FORMAT, "%s: %s: tensor '%.200s': the shape's size overflows",
                             j->fn, j->path, e->name);
        numel *= (uint64_t)dims[d];
    }
    need = numel * tb__st_dtypes[e->dtype].width;
    if (need != e->end - e->begin)
        return tb__error(TB_ERR_FORMAT,
                         "%s: %s: tensor '%.200s': data_offsets [%llu, %llu] hold %llu bytes but "
                         "%s of %llu elements needs %llu",
                         j->fn, j->path, e->name, (unsigned long long)e->begin,
                         (unsigned long long)e->end, (unsigned long long)(e->end - e->begin),
                         tb__st_dtypes[e->dtype].name, (unsigned long long)numel,
                         (unsigned long long)need);
    return TB_OK;
}

/* "__metadata__": null or an object of strings, into the set. */
static tb_status tb__st_metadata(tb__json *j, tb_tensor_set *set) {
    tb__json_space(j);
    if (j->len - j->pos >= 4 && memcmp(j->text + j->pos, "null", 4) == 0) {
        j->pos += 4;
        return TB_OK;
    }
    if (!tb__json_accept(j, '{')) return tb__json_fail(j, "'__metadata__' must be an object");
    if (tb__json_accept(j, '}')) return TB_OK;
    for (;;) {
        char *key = NULL, *value = NULL;
        size_t key_len = 0, value_len = 0;
        tb_status st = tb__json_string(j, &key, &key_len);
        if (st == TB_OK && !tb__json_accept(j, ':')) st = tb__json_fail(j, "expected ':'");
        tb__json_space(j);
        if (st == TB_OK && (j->pos >= j->len || j->text[j->pos] != '"'))
            st = tb__json_fail(j, "'__metadata__' values must be strings");
        if (st == TB_OK) st = tb__json_string(j, &value, &value_len);
        if (st == TB_OK && (key_len != strlen(key) || value_len != strlen(value)))
            st = tb__error(TB_ERR_FORMAT, "%s: %s: a metadata string holds a NUL character", j->fn,
                           j->path);
        if (st == TB_OK && tb__set_meta_find(set, key) != TB__SET_NONE)
            st = tb__error(TB_ERR_FORMAT, "%s: %s: metadata key '%.200s' appears twice", j->fn,
                           j->path, key);
        if (st == TB_OK && tb_tensor_set_set_metadata(set, key, value) != TB_OK)
            st = tb__error(tb_last_status() == TB_ERR_OUT_OF_MEMORY ? TB_ERR_OUT_OF_MEMORY
                                                                    : TB_ERR_FORMAT,
                           "%s: %s: metadata key '%.200s' is empty or longer than %d bytes", j->fn,
                           j->path, key, TB_TENSOR_SET_MAX_NAME);
        tb__free(key);
        tb__free(value);
        if (st != TB_OK) return st;
        if (tb__json_accept(j, '}')) return TB_OK;
        if (!tb__json_accept(j, ',')) return tb__json_fail(j, "expected ',' or '}'");
    }
}

/* Counts the members of the header's top-level object, checking the JSON as a whole. */
static tb_status tb__st_count(tb__json *j, size_t *count) {
    tb_status st;
    *count = 0;
    if (!tb__json_accept(j, '{')) return tb__json_fail(j, "the header must be a JSON object");
    while (!tb__json_accept(j, '}')) {
        st = tb__json_string(j, NULL, NULL);
        if (st != TB_OK) return st;
        if (!tb__json_accept(j, ':')) return tb__json_fail(j, "expected ':'");
        st = tb__json_skip(j, 1);
        if (st != TB_OK) return st;
        ++*count;
        if (tb__json_accept(j, '}')) break;
        if (!tb__json_accept(j, ',')) return tb__json_fail(j, "expected ',' or '}'");
        tb__json_space(j);
        if (j->pos < j->len && j->text[j->pos] == '}') return tb__json_fail(j, "expected a string");
    }
    tb__json_space(j);
    if (j->pos != j->len) return tb__json_fail(j, "text after the header's object");
    return TB_OK;
}

static int tb__st_by_name(const void *a, const void *b) {
    return strcmp((*(tb__st_entry *const *)a)->name, (*(tb__st_entry *const *)b)->name);
}

static int tb__st_by_offset(const void *a, const void *b) {
    const tb__st_entry *x = *(tb__st_entry *const *)a, *y = *(tb__st_entry *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

/* Names unique; the tensors' data tile [0, data_len) without gaps or overlaps. */
static tb_status tb__st_check_layout(const char *path, tb__st_entry *entries, size_t count,
                                     uint64_t data_len) {
    tb__st_entry **order;
    uint64_t expected = 0;
    size_t i;
    tb_status st = TB_OK;
    if (count == 0) {
        if (data_len == 0) return TB_OK;
        return tb__error(TB_ERR_FORMAT,
                         "tb_safetensors_load: %s: %llu bytes of data follow a header that "
                         "lists no tensor",
                         path, (unsigned long long)data_len);
    }
    order = (tb__st_entry **)tb__calloc(count, sizeof *order);
    if (order == NULL) return tb_last_status();
    for (i = 0; i < count; ++i)
        order[i] = &entries[i];
    qsort(order, count, sizeof *order, tb__st_by_name);
    for (i = 1; i < count && st == TB_OK; ++i)
        if (strcmp(order[i - 1]->name, order[i]->name) == 0)
            st = tb__error(TB_ERR_FORMAT, "tb_safetensors_load: %s: tensor '%.200s' appears twice",
                           path, order[i]->name);
    qsort(order, count, sizeof *order, tb__st_by_offset);
    for (i = 0; i < count && st == TB_OK; ++i) {
        if (order[i]->begin != expected)
            st = tb__error(TB_ERR_FORMAT,
                           "tb_safetensors_load: %s: tensor '%.200s' starts at data byte %llu "
                           "where %llu was expected (%s)",
                           path, order[i]->name, (unsigned long long)order[i]->begin,
                           (unsigned long long)expected,
                           order[i]->begin < expected ? "it overlaps another tensor"
                                                      : "a gap between tensors");
        expected = order[i]->end;
    }
    if (st == TB_OK && expected != data_len)
        st = tb__error(TB_ERR_FORMAT,
                       "tb_safetensors_load: %s: the tensors end at data byte %llu but the file "
                       "holds %llu bytes of data",
                       path, (unsigned long long)expected, (unsigned long long)data_len);
    tb__free(order);
    return st;
}

TBDEF tb_tensor_set *tb_safetensors_load(const char *path, const tb_device *device) {
    static const char fn[] = "tb_safetensors_load";
    tb__blob *blob = NULL;
    tb_tensor_set *set = NULL;
    tb__st_entry *entries = NULL;
    size_t count = 0, parsed = 0, i;
    uint64_t header_len;
    bool seen_metadata = false;
    tb__json j;
    tb_device dev;
    tb_status st;
    tb__ensure_setup();
    if (path == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: path is NULL", fn);
        return NULL;
    }
    if (tb__resolve_device(device, &dev) != TB_OK) return NULL;
    st = tb__blob_open(fn, path, &blob);
    if (st != TB_OK) return NULL;
    if (blob->size < 8) {
        tb__error(TB_ERR_FORMAT, "%s: %s is %lu bytes, shorter than the 8-byte header length", fn,
                  path, (unsigned long)blob->size);
        goto fail;
    }
    header_len = tb__le64(blob->data);
    if (header_len > blob->size - 8 || header_len > TB__ST_MAX_HEADER) {
        tb__error(TB_ERR_FORMAT, "%s: %s: the header claims %llu bytes but %s", fn, path,
                  (unsigned long long)header_len,
                  header_len > blob->size - 8 ? "the file is shorter"
                                              : "safetensors allows at most 100000000");
        goto fail;
    }
    memset(&j, 0, sizeof j);
    j.text = (const char *)blob->data + 8;
    j.len = (size_t)header_len;
    j.fn = fn;
    j.path = path;
    if (!tb__utf8_valid(blob->data + 8, j.len)) {
        tb__error(TB_ERR_FORMAT, "%s: %s: the header is not valid UTF-8", fn, path);
        goto fail;
    }
    if (tb__st_count(&j, &count) != TB_OK) goto fail;
    set = tb_tensor_set_new();
    entries = (tb__st_entry *)tb__calloc(count ? count : 1, sizeof *entries);
    if (set == NULL || entries == NULL) goto fail;
    j.pos = 0;
    tb__json_accept(&j, '{');
    for (i = 0; i < count; ++i) {
        char *key = NULL;
        size_t key_len = 0;
        if (i > 0) tb__json_accept(&j, ',');
        if (tb__json_string(&j, &key, &key_len) != TB_OK) goto fail;
        tb__json_accept(&j, ':');
        if (strcmp(key, "__metadata__") == 0 && key_len == 12) {
            tb__free(key);
            if (seen_metadata) {
                tb__error(TB_ERR_FORMAT, "%s: %s: '__metadata__' appears twice", fn, path);
                goto fail;
            }
            seen_metadata = true;
            if (tb__st_metadata(&j, set) != TB_OK) goto fail;
            continue;
        }
        entries[parsed].name = key;
        parsed++;
        if (key_len != strlen(key) || key_len == 0 || key_len > TB_TENSOR_SET_MAX_NAME) {
            tb__error(TB_ERR_FORMAT,
                      "%s: %s: a tensor name is empty, longer than %d bytes or "
                      "holds a NUL character",
                      fn, path, TB_TENSOR_SET_MAX_NAME);
            goto fail;
        }
        if (tb__st_tensor_entry(&j, &entries[parsed - 1]) != TB_OK) goto fail;
    }
    if (tb__st_check_layout(path, entries, parsed, blob->size - 8 - header_len) != TB_OK) goto fail;
    for (i = 0; i < parsed; ++i) {
        const tb__st_entry *e = &entries[i];
        const unsigned char *bytes = blob->data + 8 + header_len + e->begin;
        int64_t dims[TB_MAX_RANK];
        int32_t rank = 0;
        tb_shape shape;
        tb_tensor *t;
        j.pos = e->shape_pos;
        tb__st_shape(&j, e->name, dims, &rank);
        if (tb_shape_make(&shape, tb__st_dtypes[e->dtype].dtype, rank, dims) != TB_OK) {
            tb__error(TB_ERR_FORMAT, "%s: %s: tensor '%.200s' is too large for this machine", fn,
                      path, e->name);
            goto fail;
        }
        t = tb__blob_tensor(blob, bytes, &shape, false, &dev);
        if (t == NULL || tb__set_add_owned(fn, set, e->name, t) != TB_OK) goto fail;
    }
    for (i = 0; i < parsed; ++i)
        tb__free(entries[i].name);
    tb__free(entries);
    tb__blob_release(blob);
    return set;
fail:
    for (i = 0; i < parsed; ++i)
        tb__free(entries[i].name);
    tb__free(entries);
    tb_tensor_set_free(set);
    tb__blob_release(blob);
    return NULL;
}

/* A JSON string literal of `s` (the caller checked it is UTF-8). */
static void tb__json_append_string(tb__str *out, const char *s) {
    tb__str_append(out, "\"");
    for (; *s != '\0'; ++s) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            tb__str_append(out, "\\%c", (char)c);
        else if (c < 0x20)
            tb__str_append(out, "\\u%04x", (unsigned)c);
        else
            tb__str_append(out, "%c", (char)c);
    }
    tb__str_append(out, "\"");
}

static bool tb__utf8_string(const char *s) {
    return tb__utf8_valid((const unsigned char *)s, strlen(s));
}

TBDEF tb_status tb_safetensors_save(const char *path, const tb_tensor_set *set) {
    static const char fn[] = "tb_safetensors_save";
    static const size_t widths[4] = {8, 4, 2, 1};
    size_t *order = NULL, n = 0, i, w;
    uint64_t *begin = NULL, offset = 0;
    unsigned char length[8];
    tb__str header;
    tb__out_file out;
    tb_status st = TB_OK;
    tb__ensure_setup();
    if (path == NULL || set == NULL)
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn,
                         path == NULL ? "path" : "set");
    for (i = 0; i < set->count; ++i) {
        tb_shape shape = tb_tensor_shape(set->entries[i].tensor);
        if (!tb__utf8_string(set->entries[i].name) ||
            strcmp(set->entries[i].name, "__metadata__") == 0)
            return tb__error(TB_ERR_INVALID_ARGUMENT,
                             "%s: tensor name '%.200s' is not valid UTF-8 or is the reserved "
                             "'__metadata__'",
                             fn, set->entries[i].name);
        if (tb__st_dtype_name(shape.dtype) == NULL)
            return tb__error(TB_ERR_DTYPE,
                             "%s: tensor '%.200s' has dtype %s, which safetensors "
                             "cannot hold here",
                             fn, set->entries[i].name, tb_dtype_name(shape.dtype));
    }
    for (i = 0; i < set->meta_count; ++i)
        if (!tb__utf8_string(set->meta[i].key) || !tb__utf8_string(set->meta[i].value))
            return tb__error(TB_ERR_INVALID_ARGUMENT,
                             "%s: metadata key '%.200s' or its value is not valid UTF-8", fn,
                             set->meta[i].key);
    st = tb__set_sync(set);
    if (st != TB_OK) return st;
    order = (size_t *)tb__calloc(set->count ? set->count : 1, sizeof *order);
    begin = (uint64_t *)tb__calloc(set->count ? set->count : 1, sizeof *begin);
    if (order == NULL || begin == NULL) {
        tb__free(order);
        tb__free(begin);
        return tb_last_status();
    }
    /* the data: widest dtypes first, each group in the set's order, so all stay aligned */
    for (w = 0; w < 4; ++w) {
        for (i = 0; i < set->count; ++i) {
            tb_shape shape = tb_tensor_shape(set->entries[i].tensor);
            size_t nbytes = 0;
            if (tb_dtype_size(shape.dtype) != widths[w]) continue;
            tb_shape_nbytes(&shape, &nbytes);
            order[n++] = i;
            begin[i] = offset;
            offset += nbytes;
        }
    }
    memset(&header, 0, sizeof header);
    tb__str_append(&header, "{");
    if (set->meta_count > 0) {
        tb__str_append(&header, "\"__metadata__\":{");
        for (i = 0; i < set->meta_count; ++i) {
            if (i > 0) tb__str_append(&header, ",");
            tb__json_append_string(&header, set->meta[i].key);
            tb__str_append(&header, ":");
            tb__json_append_string(&header, set->meta[i].value);
        }
        tb__str_append(&header, "}");
    }
    for (i = 0; i < set->count; ++i) {
        tb_shape shape = tb_tensor_shape(set->entries[i].tensor);
        size_t nbytes = 0;
        int32_t d;
        tb_shape_nbytes(&shape, &nbytes);
        if (i > 0 || set->meta_count > 0) tb__str_append(&header, ",");
        tb__json_append_string(&header, set->entries[i].name);
        tb__str_append(&header, ":{\"dtype\":\"%s\",\"shape\":[", tb__st_dtype_name(shape.dtype));
        for (d = 0; d < shape.rank; ++d)
            tb__str_append(&header, "%s%lld", d ? "," : "", (long long)shape.dims[d]);
        tb__str_append(&header, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)begin[i],
                       (unsigned long long)(begin[i] + nbytes));
    }
    tb__str_append(&header, "}");
    while (!header.failed && (8 + header.len) % 8 != 0)
        tb__str_append(&header, " ");
    if (header.failed) {
        st = tb__error(TB_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    } else {
        for (i = 0; i < 8; ++i)
            length[i] = (unsigned char)(((uint64_t)header.len >> (8 * i)) & 0xff);
        st = tb__out_open(fn, path, &out);
    }
    if (st == TB_OK) {
        tb__out_write(&out, length, 8);
        tb__out_write(&out, header.data, header.len);
        for (i = 0; i < n && st == TB_OK && !out.failed; ++i) {
            const unsigned char *bytes = NULL;
            unsigned char *copy = NULL;
            size_t nbytes = 0;
            st = tb__tensor_le_bytes(set->entries[order[i]].tensor, &bytes, &nbytes, &copy);
            if (st == TB_OK) tb__out_write(&out, bytes, nbytes);
            tb__free(copy);
        }
        if (st == TB_OK)
            st = tb__out_close(fn, &out, true);
        else
            tb__out_close(fn, &out, false);
    }
    tb__str_free(&header);
    tb__free(order);
    tb__free(begin);
    return st;
}
