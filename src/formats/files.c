/* ===========================================================================================
   Model files: tensor sets, and what the file formats share: a file's bytes (memory-mapped,
   shared by the tensors that use them in place), little-endian reads, UTF-8 checks, writing
   through a temporary file and a tensor's bytes to write. The formats: safetensors.c, npz.c,
   idx.c (and inflate.c); the types the parts share: files_internal.h.
   =========================================================================================== */

#if !defined(_WIN32)
#include <sys/mman.h>
#endif

/* ---- tensor sets ---- */

static size_t tb__set_slot_of(const char *name, size_t slot_count) {
    return (size_t)tb__hash_bytes(0x7e5e7, name, strlen(name)) & (slot_count - 1);
}

static size_t tb__set_find(const tb_tensor_set *set, const char *name) {
    size_t i;
    if (set->slot_count == 0) return TB__SET_NONE;
    for (i = tb__set_slot_of(name, set->slot_count); set->slots[i] != 0;
         i = (i + 1) & (set->slot_count - 1)) {
        if (strcmp(set->entries[set->slots[i] - 1].name, name) == 0) return set->slots[i] - 1;
    }
    return TB__SET_NONE;
}

/* Makes room in the index for `need` names (rebuilding it larger when needed). */
static tb_status tb__set_reserve_index(tb_tensor_set *set, size_t need) {
    size_t count = set->slot_count ? set->slot_count : 16, i, *slots;
    if (need <= set->slot_count / 2) return TB_OK;
    while (count / 2 < need)
        count *= 2;
    slots = (size_t *)tb__calloc(count, sizeof *slots);
    if (slots == NULL) return tb_last_status();
    for (i = 0; i < set->count; ++i) {
        size_t s = tb__set_slot_of(set->entries[i].name, count);
        while (slots[s] != 0)
            s = (s + 1) & (count - 1);
        slots[s] = i + 1;
    }
    tb__free(set->slots);
    set->slots = slots;
    set->slot_count = count;
    return TB_OK;
}

/* The length of `name` if it is a valid name (1..TB_TENSOR_SET_MAX_NAME bytes), else 0. */
static size_t tb__set_name_length(const char *name) {
    size_t n = 0;
    while (n <= TB_TENSOR_SET_MAX_NAME && name[n] != '\0')
        ++n;
    return n <= TB_TENSOR_SET_MAX_NAME ? n : 0;
}

/* Appends `tensor` under `name`, taking over the caller's reference (released on error). */
static tb_status tb__set_add_owned(const char *fn, tb_tensor_set *set, const char *name,
                                   tb_tensor *tensor) {
    char *copy;
    tb_status st;
    if (tb__set_name_length(name) == 0) {
        tb_tensor_release(tensor);
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: a tensor name must be 1 to %d bytes", fn,
                         TB_TENSOR_SET_MAX_NAME);
    }
    if (tb__set_find(set, name) != TB__SET_NONE) {
        tb_tensor_release(tensor);
        return tb__error(TB_ERR_DUPLICATE, "%s: the set already has a tensor named '%s'", fn, name);
    }
    st = tb__grow((void **)&set->entries, &set->cap, set->count + 1, sizeof *set->entries);
    if (st == TB_OK) st = tb__set_reserve_index(set, set->count + 1);
    copy = st == TB_OK ? tb__strdup(name) : NULL;
    if (copy == NULL) {
        tb_tensor_release(tensor);
        return tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_OUT_OF_MEMORY;
    }
    set->entries[set->count].name = copy;
    tb__scope_disown(tensor); /* the set keeps the reference: a scope no longer owns it */
    set->entries[set->count].tensor = tensor;
    {
        size_t s = tb__set_slot_of(copy, set->slot_count);
        while (set->slots[s] != 0)
            s = (s + 1) & (set->slot_count - 1);
        set->slots[s] = set->count + 1;
    }
    set->count++;
    return TB_OK;
}

TBDEF tb_tensor_set *tb_tensor_set_new(void) {
    tb__ensure_setup();
    return (tb_tensor_set *)tb__calloc(1, sizeof(tb_tensor_set));
}

TBDEF void tb_tensor_set_free(tb_tensor_set *set) {
    size_t i;
    if (set == NULL) return;
    for (i = 0; i < set->count; ++i) {
        tb_tensor_release(set->entries[i].tensor);
        tb__free(set->entries[i].name);
    }
    for (i = 0; i < set->meta_count; ++i) {
        tb__free(set->meta[i].key);
        tb__free(set->meta[i].value);
    }
    tb__free(set->entries);
    tb__free(set->slots);
    tb__free(set->meta);
    tb__free(set);
}

TBDEF tb_status tb_tensor_set_add(tb_tensor_set *set, const char *name, tb_tensor *tensor) {
    tb__ensure_setup();
    if (set == NULL || name == NULL)
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_tensor_set_add: %s is NULL",
                         set == NULL ? "set" : "name");
    if (tensor == NULL) {
        if (tb_last_status() != TB_OK) return tb_last_status();
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_tensor_set_add: tensor is NULL");
    }
    return tb__set_add_owned("tb_tensor_set_add", set, name, tb_tensor_retain(tensor));
}

TBDEF size_t tb_tensor_set_count(const tb_tensor_set *set) {
    return set != NULL ? set->count : 0;
}

static bool tb__set_index_ok(const char *fn, const tb_tensor_set *set, size_t index) {
    tb__ensure_setup();
    if (set == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: set is NULL", fn);
        return false;
    }
    if (index >= set->count) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: index %lu is past the set's %lu tensors", fn,
                  (unsigned long)index, (unsigned long)set->count);
        return false;
    }
    return true;
}

TBDEF const char *tb_tensor_set_name(const tb_tensor_set *set, size_t index) {
    return tb__set_index_ok("tb_tensor_set_name", set, index) ? set->entries[index].name : NULL;
}

TBDEF tb_tensor *tb_tensor_set_tensor(const tb_tensor_set *set, size_t index) {
    return tb__set_index_ok("tb_tensor_set_tensor", set, index) ? set->entries[index].tensor : NULL;
}

TBDEF tb_tensor *tb_tensor_set_get(const tb_tensor_set *set, const char *name) {
    size_t i;
    tb__str known;
    tb__ensure_setup();
    if (set == NULL || name == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "tb_tensor_set_get: %s is NULL",
                  set == NULL ? "set" : "name");
        return NULL;
    }
    i = tb__set_find(set, name);
    if (i != TB__SET_NONE) return set->entries[i].tensor;
    memset(&known, 0, sizeof known);
    for (i = 0; i < set->count && i < 8; ++i)
        tb__str_append(&known, "%s'%.64s'", i ? ", " : "", set->entries[i].name);
    if (set->count > 8) tb__str_append(&known, ", ...");
    tb__error(TB_ERR_NOT_FOUND, "tb_tensor_set_get: no tensor named '%.200s' (the set has %lu%s%s)",
              name, (unsigned long)set->count, set->count ? ": " : "",
              known.data != NULL && !known.failed ? known.data : "");
    tb__str_free(&known);
    return NULL;
}

static size_t tb__set_meta_find(const tb_tensor_set *set, const char *key) {
    size_t i;
    for (i = 0; i < set->meta_count; ++i)
        if (strcmp(set->meta[i].key, key) == 0) return i;
    return TB__SET_NONE;
}

TBDEF tb_status tb_tensor_set_set_metadata(tb_tensor_set *set, const char *key, const char *value) {
    size_t i;
    char *k = NULL, *v;
    tb__ensure_setup();
    if (set == NULL || key == NULL || value == NULL)
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_tensor_set_set_metadata: %s is NULL",
                         set == NULL   ? "set"
                         : key == NULL ? "key"
                                       : "value");
    if (tb__set_name_length(key) == 0)
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "tb_tensor_set_set_metadata: a key must be 1 to %d bytes",
                         TB_TENSOR_SET_MAX_NAME);
    i = tb__set_meta_find(set, key);
    v = tb__strdup(value);
    if (v == NULL) return tb_last_status();
    if (i != TB__SET_NONE) {
        tb__free(set->meta[i].value);
        set->meta[i].value = v;
        return TB_OK;
    }
    if (tb__grow((void **)&set->meta, &set->meta_cap, set->meta_count + 1, sizeof *set->meta) !=
            TB_OK ||
        (k = tb__strdup(key)) == NULL) {
        tb__free(v);
        return tb_last_status();
    }
    set->meta[set->meta_count].key = k;
    set->meta[set->meta_count].value = v;
    set->meta_count++;
    return TB_OK;
}

TBDEF const char *tb_tensor_set_metadata(const tb_tensor_set *set, const char *key) {
    size_t i;
    tb__ensure_setup();
    if (set == NULL || key == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "tb_tensor_set_metadata: %s is NULL",
                  set == NULL ? "set" : "key");
        return NULL;
    }
    i = tb__set_meta_find(set, key);
    if (i == TB__SET_NONE) {
        tb__error(TB_ERR_NOT_FOUND, "tb_tensor_set_metadata: no metadata key '%.200s'", key);
        return NULL;
    }
    return set->meta[i].value;
}

TBDEF size_t tb_tensor_set_metadata_count(const tb_tensor_set *set) {
    return set != NULL ? set->meta_count : 0;
}

TBDEF const char *tb_tensor_set_metadata_key(const tb_tensor_set *set, size_t index) {
    tb__ensure_setup();
    if (set == NULL || index >= set->meta_count) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "tb_tensor_set_metadata_key: %s",
                  set == NULL ? "set is NULL" : "index is past the end");
        return NULL;
    }
    return set->meta[index].key;
}

/* Syncs the set's pending tensors, one graph per device (so that a model's tensors computed
   together compile once). */
static tb_status tb__set_sync(const tb_tensor_set *set) {
    tb_tensor **group;
    size_t i, j, n;
    tb_status st = TB_OK;
    if (set->count == 0) return TB_OK;
    group = (tb_tensor **)tb__calloc(set->count, sizeof *group);
    if (group == NULL) return tb_last_status();
    for (i = 0; i < set->count && st == TB_OK; ++i) {
        tb_device dev = tb_tensor_device(set->entries[i].tensor);
        bool first = true;
        if (tb_tensor_node(set->entries[i].tensor) == NULL) continue;
        for (j = 0; j < i && first; ++j) { /* this device was synced with an earlier tensor */
            tb_device other = tb_tensor_device(set->entries[j].tensor);
            if (tb_device_equal(&dev, &other)) first = false;
        }
        if (!first) continue;
        for (n = 0, j = i; j < set->count; ++j) {
            tb_device other = tb_tensor_device(set->entries[j].tensor);
            if (tb_device_equal(&dev, &other)) group[n++] = set->entries[j].tensor;
        }
        st = tb_sync(group, n);
    }
    tb__free(group);
    return st;
}

/* ---- a file's bytes, shared by the tensors that use them in place ---- */

static void tb__blob_release(void *context) {
    tb__blob *b = (tb__blob *)context;
    if (b == NULL || TB__ATOMIC_ADD(&b->refcount, -1) != 0) return;
#if !defined(_WIN32)
    if (b->mapped) {
        munmap(b->data, b->size);
        b->data = NULL;
    }
#endif
    tb__free(b->data);
    tb__free(b);
}

/* A blob owning `data` (from tb__alloc; freed here on error). */
static tb__blob *tb__blob_owning(unsigned char *data, size_t size) {
    tb__blob *b = (tb__blob *)tb__calloc(1, sizeof *b);
    if (b == NULL) {
        tb__free(data);
        return NULL;
    }
    b->refcount = 1;
    b->data = data;
    b->size = size;
    return b;
}

/* The whole file: memory-mapped where the system allows, else read into memory. */
static tb_status tb__blob_open(const char *fn, const char *path, tb__blob **out) {
    unsigned char *data = NULL;
    size_t size = 0;
#if !defined(_WIN32)
    struct stat st;
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return tb__error(errno == ENOENT ? TB_ERR_NOT_FOUND : TB_ERR_IO, "%s: cannot open %s: %s",
                         fn, path, strerror(errno));
    errno = 0;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < 0 ||
        (uint64_t)st.st_size > (uint64_t)SIZE_MAX) {
        int e = errno; /* 0 unless fstat itself failed: nothing stale in the message */
        close(fd);
        return tb__error(TB_ERR_IO, "%s: %s is not a regular file that can be read%s%s", fn, path,
                         e ? ": " : "", e ? strerror(e) : "");
    }
    size = (size_t)st.st_size;
    if (size > 0) {
        void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map != MAP_FAILED) {
            tb__blob *b;
            close(fd);
            b = (tb__blob *)tb__calloc(1, sizeof *b);
            if (b == NULL) {
                munmap(map, size);
                return tb_last_status();
            }
            b->refcount = 1;
            b->data = (unsigned char *)map;
            b->size = size;
            b->mapped = true;
            *out = b;
            return TB_OK;
        }
        data = (unsigned char *)tb__alloc(size);
        if (data == NULL) {
            close(fd);
            return tb_last_status();
        }
        {
            size_t got = 0;
            while (got < size) {
                ssize_t n = read(fd, data + got, size - got);
                if (n < 0 && errno == EINTR) continue;
                if (n <= 0) {
                    int e = n < 0 ? errno : 0;
                    close(fd);
                    tb__free(data);
                    return tb__error(TB_ERR_IO, "%s: cannot read %s: %s", fn, path,
                                     e ? strerror(e) : "the file shrank while being read");
                }
                got += (size_t)n;
            }
        }
    }
    close(fd);
#else
    FILE *f = fopen(path, "rb");
    long end;
    if (f == NULL)
        return tb__error(errno == ENOENT ? TB_ERR_NOT_FOUND : TB_ERR_IO, "%s: cannot open %s: %s",
                         fn, path, strerror(errno));
    if (fseek(f, 0, SEEK_END) != 0 || (end = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return tb__error(TB_ERR_IO, "%s: cannot read %s", fn, path);
    }
    size = (size_t)end;
    if (size > 0) {
        data = (unsigned char *)tb__alloc(size);
        if (data == NULL || fread(data, 1, size, f) != size) {
            fclose(f);
            tb__free(data);
            return data == NULL ? tb_last_status()
                                : tb__error(TB_ERR_IO, "%s: cannot read %s", fn, path);
        }
    }
    fclose(f);
#endif
    *out = tb__blob_owning(data, size);
    return *out != NULL ? TB_OK : tb_last_status();
}

/* A tensor of `shape` whose elements are the bytes at `bytes` inside `blob`, little-endian
   unless `big_endian`. On a device that shares host memory it uses them in place when they are
   aligned for the dtype, in the host's byte order and (for bool) all 0 or 1; the tensor's
   buffer then holds a reference to the blob. Otherwise the tensor gets a converted copy. */
static tb_tensor *tb__blob_tensor(tb__blob *blob, const unsigned char *bytes, const tb_shape *shape,
                                  bool big_endian, const tb_device *device) {
    size_t nbytes = 0, width = tb_dtype_size(shape->dtype), i;
    bool in_place;
    unsigned char *copy;
    tb_tensor *t;
    if (tb_shape_nbytes(shape, &nbytes) != TB_OK) return NULL;
    if (nbytes == 0) return tb_tensor_from_host(NULL, shape, device);
    in_place =
        (uintptr_t)bytes % width == 0 && (width == 1 || big_endian != tb__host_is_little_endian());
    for (i = 0; in_place && shape->dtype == TB_BOOL && i < nbytes; ++i)
        in_place = bytes[i] <= 1;
    if (in_place) {
        /* the tensor's data holds a reference to the blob (given back at once by a device
           that copied) */
        TB__ATOMIC_ADD(&blob->refcount, 1);
        t = tb__tensor_borrow("tb_tensor_from_host_borrowed", bytes, shape, device,
                              tb__blob_release, blob);
        if (t == NULL) TB__ATOMIC_ADD(&blob->refcount, -1); /* not the last: the caller's */
        return t;
    }
    if ((width == 1 || big_endian != tb__host_is_little_endian()) && shape->dtype != TB_BOOL)
        return tb_tensor_from_host(bytes, shape, device); /* only misaligned: one copy */
    copy = (unsigned char *)tb__alloc(nbytes);
    if (copy == NULL) return NULL;
    memcpy(copy, bytes, nbytes);
    if (width > 1 && big_endian == tb__host_is_little_endian())
        tb__swap_bytes(copy, nbytes / width, width);
    if (shape->dtype == TB_BOOL)
        for (i = 0; i < nbytes; ++i)
            copy[i] = copy[i] != 0;
    t = tb_tensor_from_host(copy, shape, device);
    tb__free(copy);
    return t;
}

static uint16_t tb__le16(const unsigned char *p) {
    return (uint16_t)(p[0] | (p[1] << 8));
}

static uint32_t tb__le32(const unsigned char *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static uint64_t tb__le64(const unsigned char *p) {
    return (uint64_t)tb__le32(p) | ((uint64_t)tb__le32(p + 4) << 32);
}

/* Whether `n` bytes are well-formed UTF-8 (no overlong forms, surrogates or values past
   U+10FFFF). */
static bool tb__utf8_valid(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        size_t len, k;
        uint32_t cp;
        if (c < 0x80) {
            ++i;
            continue;
        }
        if (c >= 0xc2 && c <= 0xdf) {
            len = 2;
            cp = c & 0x1f;
        } else if (c >= 0xe0 && c <= 0xef) {
            len = 3;
            cp = c & 0x0f;
        } else if (c >= 0xf0 && c <= 0xf4) {
            len = 4;
            cp = c & 0x07;
        } else {
            return false;
        }
        if (n - i < len) return false;
        for (k = 1; k < len; ++k) {
            if ((s[i + k] & 0xc0) != 0x80) return false;
            cp = (cp << 6) | (s[i + k] & 0x3f);
        }
        if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
            (cp >= 0xd800 && cp <= 0xdfff))
            return false;
        i += len;
    }
    return true;
}

/* Writing a file through a temporary one and a rename (tb__out_file). */
static tb_status tb__out_open(const char *fn, const char *path, tb__out_file *o) {
    memset(o, 0, sizeof *o);
    o->path = path;
    o->tmp = tb__format("%s.tmp%lu", path, (unsigned long)tb__now_ns());
    if (o->tmp == NULL) return tb_last_status();
    o->f = fopen(o->tmp, "wb");
    if (o->f == NULL) {
        tb_status st = tb__error(TB_ERR_IO, "%s: cannot write %s: %s", fn, o->tmp, strerror(errno));
        tb__free(o->tmp);
        o->tmp = NULL;
        return st;
    }
    return TB_OK;
}

static void tb__out_write(tb__out_file *o, const void *data, size_t size) {
    if (o->failed || size == 0) return;
    if (fwrite(data, 1, size, o->f) != size)
        o->failed = true;
    else
        o->written += size;
}

/* Closes the file and renames it into place when `ok` and every write worked; removes it
   otherwise. Returns the error of a failed write. */
static tb_status tb__out_close(const char *fn, tb__out_file *o, bool ok) {
    tb_status st = TB_OK;
    int saved = 0;
    if (o->f != NULL) {
        if (fclose(o->f) != 0) o->failed = true;
        o->f = NULL;
    }
    if (ok && o->failed) saved = errno;
    if (ok && !o->failed && rename(o->tmp, o->path) != 0) {
        saved = errno;
        o->failed = true;
    }
    if (ok && o->failed)
        st = tb__error(TB_ERR_IO, "%s: cannot write %s: %s", fn, o->path,
                       saved ? strerror(saved) : "write failed");
    if (!ok || o->failed) remove(o->tmp);
    tb__free(o->tmp);
    o->tmp = NULL;
    return st;
}

/* The value of a synced tensor as contiguous host bytes, little-endian: the tensor's own buffer
   on the cpu backend (and a little-endian host), else a copy in *copy that the caller frees. */
static tb_status tb__tensor_le_bytes(tb_tensor *t, const unsigned char **bytes, size_t *nbytes,
                                     unsigned char **copy) {
    tb_shape shape = tb_tensor_shape(t);
    tb_backend_data *data;
    void *host;
    tb_status st = tb_shape_nbytes(&shape, nbytes);
    size_t width = tb_dtype_size(shape.dtype);
    *copy = NULL;
    if (st != TB_OK) return st;
    data = tb_tensor_data(t);
    if (data == NULL) return tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_INTERNAL;
    host = tb__host_data(data);
    if (host != NULL && (width == 1 || tb__host_is_little_endian())) {
        *bytes = (const unsigned char *)host;
        return TB_OK;
    }
    *copy = (unsigned char *)tb__alloc(*nbytes ? *nbytes : 1);
    if (*copy == NULL) return tb_last_status();
    st = tb_tensor_to_host(t, *copy, *nbytes);
    if (st != TB_OK) {
        tb__free(*copy);
        *copy = NULL;
        return st;
    }
    if (width > 1 && !tb__host_is_little_endian()) tb__swap_bytes(*copy, *nbytes / width, width);
    *bytes = *copy;
    return TB_OK;
}

/* ---- optimizer state (a checkpoint's second half) ---- */

static const char *const tb__optim_state_names[3][2] = {
    {"momentum_buffer", NULL}, {"exp_avg", "exp_avg_sq"}, {"exp_avg", "exp_avg_sq"}};
static const char *const tb__optim_kind_names[3] = {"sgd", "adam", "adamw"};

/* "<prefix><middle><i><suffix>" into buf; false when it does not fit */
static bool tb__optim_key(char *buf, size_t cap, const char *prefix, const char *middle, size_t i,
                          const char *suffix) {
    int n = i == (size_t)-1 ? snprintf(buf, cap, "%s%s", prefix, middle)
                            : snprintf(buf, cap, "%s%s%zu.%s", prefix, middle, i, suffix);
    return n >= 0 && (size_t)n < cap;
}

static tb_status tb__optim_prefix_ok(const char *fn, const void *opt, const void *set,
                                     const char *prefix) {
    if (opt == NULL || set == NULL)
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn,
                         opt == NULL ? "opt" : "set");
    if (prefix != NULL && strlen(prefix) > TB_TENSOR_SET_MAX_NAME - 64)
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: prefix is longer than %d bytes", fn,
                         TB_TENSOR_SET_MAX_NAME - 64);
    return TB_OK;
}

TBDEF tb_status tb_optimizer_state_save(const tb_optimizer *opt, tb_tensor_set *set,
                                        const char *prefix) {
    const char *fn = "tb_optimizer_state_save";
    tb__optim_view v;
    char key[256 + TB_TENSOR_SET_MAX_NAME], num[64];
    size_t i;
    int pass, s, kind;
    tb_status st = tb__optim_prefix_ok(fn, opt, set, prefix);
    if (st != TB_OK) return st;
    if (prefix == NULL) prefix = "";
    v = tb__optim_view_of((tb_optimizer *)opt);
    kind = (int)v.d->kind - 1;
    /* pass 0: every name is free; pass 1: add */
    for (pass = 0; pass < 2; pass++)
        for (i = 0; i < v.n; i++)
            for (s = 0; s < 3; s++) {
                const char *what = s < 2 ? tb__optim_state_names[kind][s] : "step";
                tb_tensor *t;
                if (s < 2 && (what == NULL || v.state[s] == NULL)) continue;
                tb__optim_key(key, sizeof key, prefix, "state.", i, what);
                if (pass == 0) {
                    if (tb__set_find(set, key) != TB__SET_NONE)
                        return tb__error(TB_ERR_DUPLICATE, "%s: the set already has \"%s\"", fn,
                                         key);
                    continue;
                }
                if (s < 2) {
                    t = tb_detach(v.state[s][i]);
                } else {
                    tb_device dev = tb_tensor_device(v.params[i]);
                    t = tb_scalar_tensor(tb_scalar_i(TB_I64, v.steps[i]), &dev);
                }
                st = t != NULL ? tb_tensor_set_add(set, key, t) : tb_last_status();
                tb_tensor_release(t);
                if (st != TB_OK) return st;
            }
    tb__optim_key(key, sizeof key, prefix, "kind", (size_t)-1, NULL);
    st = tb_tensor_set_set_metadata(set, key, tb__optim_kind_names[kind]);
    snprintf(num, sizeof num, "%lld", (long long)*v.total_steps);
    if (st == TB_OK && tb__optim_key(key, sizeof key, prefix, "steps", (size_t)-1, NULL))
        st = tb_tensor_set_set_metadata(set, key, num);
    snprintf(num, sizeof num, "%.17g", v.d->lr);
    if (st == TB_OK && tb__optim_key(key, sizeof key, prefix, "lr", (size_t)-1, NULL))
        st = tb_tensor_set_set_metadata(set, key, num);
    return st;
}

/* The entry `key` of the set as a tensor like `like` (shape, dtype) on like's device: a new
   reference, or NULL with the error set. */
static tb_tensor *tb__optim_entry(const char *fn, const tb_tensor_set *set, const char *key,
                                  tb_tensor *like, const tb_shape *want) {
    size_t at = tb__set_find(set, key);
    tb_tensor *t;
    tb_shape ts;
    tb_device dl = tb_tensor_device(like), dt;
    char sa[96], sb[96];
    if (at == TB__SET_NONE) {
        tb__error(TB_ERR_NOT_FOUND, "%s: the set has no \"%s\"", fn, key);
        return NULL;
    }
    t = set->entries[at].tensor;
    ts = tb_tensor_shape(t);
    if (!tb_shape_equal(&ts, want)) {
        tb__shape_text(&ts, sa);
        tb__shape_text(want, sb);
        tb__error(TB_ERR_SHAPE, "%s: \"%s\" is %s; the optimizer's is %s", fn, key, sa, sb);
        return NULL;
    }
    dt = tb_tensor_device(t);
    return tb_device_equal(&dt, &dl) ? tb_tensor_retain(t) : tb_to_device(t, &dl);
}

static bool tb__optim_meta(const char *fn, const tb_tensor_set *set, const char *prefix,
                           const char *name, char *key, size_t cap, const char **value) {
    size_t at;
    tb__optim_key(key, cap, prefix, name, (size_t)-1, NULL);
    at = tb__set_meta_find(set, key);
    if (at == TB__SET_NONE) {
        tb__error(TB_ERR_NOT_FOUND, "%s: the set has no metadata \"%s\"", fn, key);
        return false;
    }
    *value = set->meta[at].value;
    return true;
}

/* The metadata of a saved state: kind (checked), total steps and lr. */
static tb_status tb__optim_load_meta(const char *fn, const tb_tensor_set *set, const char *prefix,
                                     int kind, int64_t *total, double *lr) {
    char key[256 + TB_TENSOR_SET_MAX_NAME], *end;
    const char *v;
    long long n;
    if (!tb__optim_meta(fn, set, prefix, "kind", key, sizeof key, &v)) return tb_last_status();
    if (strcmp(v, tb__optim_kind_names[kind]) != 0)
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: \"%s\" is \"%.32s\"; this optimizer is %s",
                         fn, key, v, tb__optim_kind_names[kind]);
    if (!tb__optim_meta(fn, set, prefix, "steps", key, sizeof key, &v)) return tb_last_status();
    errno = 0;
    n = strtoll(v, &end, 10);
    if (errno != 0 || end == v || *end != '\0' || n < 0)
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: \"%s\" is \"%.32s\", not a step count", fn,
                         key, v);
    *total = (int64_t)n;
    if (!tb__optim_meta(fn, set, prefix, "lr", key, sizeof key, &v)) return tb_last_status();
    *lr = strtod(v, &end);
    if (end == v || *end != '\0' || !(*lr > 0.0) || isinf(*lr))
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: \"%s\" is \"%.32s\", not a learning rate",
                         fn, key, v);
    return TB_OK;
}

TBDEF tb_status tb_optimizer_state_load(tb_optimizer *opt, const tb_tensor_set *set,
                                        const char *prefix) {
    const char *fn = "tb_optimizer_state_load";
    tb__optim_view v;
    char key[256 + TB_TENSOR_SET_MAX_NAME];
    tb_tensor **got = NULL;
    int64_t *steps = NULL, total = 0;
    double lr = 0;
    size_t i, n;
    int s, kind;
    tb_status st = tb__optim_prefix_ok(fn, opt, set, prefix);
    if (st != TB_OK) return st;
    if (prefix == NULL) prefix = "";
    v = tb__optim_view_of(opt);
    kind = (int)v.d->kind - 1;
    st = tb__optim_load_meta(fn, set, prefix, kind, &total, &lr);
    if (st != TB_OK) return st;
    n = v.n;
    got = n > 0 ? (tb_tensor **)tb__calloc(2 * n, sizeof(tb_tensor *)) : NULL;
    steps = n > 0 ? (int64_t *)tb__calloc(n, sizeof(int64_t)) : NULL;
    if (n > 0 && (got == NULL || steps == NULL)) {
        st = tb__error(TB_ERR_OUT_OF_MEMORY, "%s: no memory", fn);
        n = 0;
    }
    for (i = 0; st == TB_OK && i < n; i++) {
        tb_shape ps = tb_tensor_shape(v.params[i]), ss;
        tb_tensor *step;
        for (s = 0; st == TB_OK && s < 2; s++) {
            if (v.state[s] == NULL) continue;
            tb__optim_key(key, sizeof key, prefix, "state.", i, tb__optim_state_names[kind][s]);
            got[2 * i + (size_t)s] = tb__optim_entry(fn, set, key, v.params[i], &ps);
            if (got[2 * i + (size_t)s] == NULL) st = tb_last_status();
        }
        if (st != TB_OK) break;
        tb__optim_key(key, sizeof key, prefix, "state.", i, "step");
        tb_shape_make(&ss, TB_I64, 0, NULL);
        step = tb__optim_entry(fn, set, key, v.params[i], &ss);
        st = step != NULL ? tb_tensor_to_host(step, &steps[i], sizeof steps[i]) : tb_last_status();
        tb_tensor_release(step);
        if (st == TB_OK && steps[i] < 0)
            st = tb__error(TB_ERR_INVALID_ARGUMENT, "%s: \"%s\" is negative", fn, key);
    }
    for (i = 0; st == TB_OK && i < n; i++) /* assignments between equal shapes cannot fail */
        for (s = 0; s < 2; s++)
            if (got[2 * i + (size_t)s] != NULL)
                st = tb_assign(v.state[s][i], got[2 * i + (size_t)s]);
    if (st == TB_OK) {
        if (n > 0) memcpy(v.steps, steps, sizeof(int64_t) * n);
        *v.total_steps = total;
        v.d->lr = lr;
    }
    for (i = 0; got != NULL && i < 2 * n; i++)
        tb_tensor_release(got[i]);
    tb__free(got);
    tb__free(steps);
    return st;
}
