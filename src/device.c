/* ===========================================================================================
   Devices: text form, resolution through the registry, the per-thread device guard
   =========================================================================================== */
#include "impl_begin.h"

/* The calling thread's innermost guarded device. */
static TB__THREAD_LOCAL tb_device tb__guard_device;
static TB__THREAD_LOCAL bool tb__guard_active = false;

TBDEF const char *tb_device_type_name(tb_device_type type) {
    switch (type) {
    case TB_DEVICE_CPU:
        return "CPU";
    case TB_DEVICE_GPU:
        return "GPU";
    case TB_DEVICE_ACCELERATOR:
        return "ACCELERATOR";
    case TB_DEVICE_TYPE_COUNT:
        break;
    }
    return "invalid";
}

static bool tb__ascii_iequal(const char *a, const char *b) {
    for (; *a != '\0' && *b != '\0'; a++, b++) {
        char ca = (*a >= 'A' && *a <= 'Z') ? (char)(*a - 'A' + 'a') : *a;
        char cb = (*b >= 'A' && *b <= 'Z') ? (char)(*b - 'A' + 'a') : *b;
        if (ca != cb) return false;
    }
    return *a == *b;
}

TBDEF tb_status tb_device_type_parse(const char *text, tb_device_type *out) {
    int t;
    if (text == NULL || out == NULL) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_device_type_parse: %s is NULL",
                         text == NULL ? "text" : "out");
    }
    for (t = 0; t < (int)TB_DEVICE_TYPE_COUNT; t++) {
        if (tb__ascii_iequal(text, tb_device_type_name((tb_device_type)t))) {
            *out = (tb_device_type)t;
            return TB_OK;
        }
    }
    return tb__error(TB_ERR_INVALID_ARGUMENT,
                     "tb_device_type_parse: unknown device type '%.64s' (expected cpu, gpu or "
                     "accelerator)",
                     text);
}

TBDEF tb_status tb_device_make(const char *backend, int32_t ordinal, tb_device *out) {
    if (backend == NULL || out == NULL) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_device_make: %s is NULL",
                         backend == NULL ? "backend" : "out");
    }
    tb__ensure_setup();
    return tb__backend_device("tb_device_make", backend, ordinal, out);
}

TBDEF size_t tb_device_format(const tb_device *device, char *buf, size_t cap) {
    char text[TB_MAX_NAME + 32];
    int n;
    size_t len;
    if (device == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "tb_device_format: device is NULL");
        n = 0;
        text[0] = '\0';
    } else if (device->backend[0] == '\0') {
        n = snprintf(text, sizeof text, "current");
    } else {
        n = snprintf(text, sizeof text, "%.*s:%d", TB_MAX_NAME, device->backend,
                     (int)device->ordinal);
    }
    len = n < 0 ? 0 : (size_t)n;
    if (buf != NULL && cap > 0) {
        size_t c = len < cap ? len : cap - 1;
        memcpy(buf, text, c);
        buf[c] = '\0';
    }
    return len;
}

/* Splits "backend[:ordinal]" without consulting the registry. */
static tb_status tb__device_text_split(const char *fn, const char *text, char name[TB_MAX_NAME + 1],
                                       int32_t *ordinal) {
    size_t n = 0;
    const char *p = text;
    int64_t v = 0;
    while ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || *p == '_' ||
           (n > 0 && *p >= '0' && *p <= '9')) {
        if (n == TB_MAX_NAME) {
            return tb__error(TB_ERR_INVALID_ARGUMENT,
                             "%s: bad device '%.64s': backend name longer than %d bytes", fn, text,
                             TB_MAX_NAME);
        }
        name[n++] = *p++;
    }
    name[n] = '\0';
    if (n == 0) {
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "%s: bad device '%.64s': expected 'backend' or 'backend:ordinal'", fn,
                         text);
    }
    *ordinal = 0;
    if (*p == '\0') return TB_OK;
    if (*p != ':') {
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "%s: bad device '%.64s': unexpected '%c' at position %d (expected "
                         "'backend' or 'backend:ordinal')",
                         fn, text, *p, (int)(p - text));
    }
    p++;
    if (*p < '0' || *p > '9') {
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "%s: bad device '%.64s': the ordinal must be a number >= 0", fn, text);
    }
    while (*p >= '0' && *p <= '9') {
        v = v * 10 + (*p - '0');
        if (v > INT32_MAX) {
            return tb__error(TB_ERR_INVALID_ARGUMENT,
                             "%s: bad device '%.64s': ordinal larger than %d", fn, text,
                             (int)INT32_MAX);
        }
        p++;
    }
    if (*p != '\0') {
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "%s: bad device '%.64s': unexpected '%c' at position %d", fn, text, *p,
                         (int)(p - text));
    }
    *ordinal = (int32_t)v;
    return TB_OK;
}

static tb_status tb__device_parse(const char *fn, const char *text, tb_device *out) {
    char name[TB_MAX_NAME + 1];
    int32_t ordinal;
    tb_status st = tb__device_text_split(fn, text, name, &ordinal);
    if (st != TB_OK) return st;
    return tb__backend_device(fn, name, ordinal, out);
}

TBDEF tb_status tb_device_parse(const char *text, tb_device *out) {
    if (text == NULL || out == NULL) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_device_parse: %s is NULL",
                         text == NULL ? "text" : "out");
    }
    tb__ensure_setup();
    return tb__device_parse("tb_device_parse", text, out);
}

TBDEF bool tb_device_equal(const tb_device *a, const tb_device *b) {
    if (a == NULL || b == NULL) return false;
    return a->ordinal == b->ordinal && strncmp(a->backend, b->backend, sizeof a->backend) == 0;
}

TBDEF tb_status tb_current_device(tb_device *out) {
    const tb_desc *desc;
    if (out == NULL) return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_current_device: out is NULL");
    if (tb__guard_active) {
        *out = tb__guard_device;
        return TB_OK;
    }
    desc = tb__desc();
    if (desc->device != NULL) {
        tb_device d;
        tb_status st = tb__device_parse("tb_current_device", desc->device, &d);
        if (st != TB_OK) {
            /* Keep the reason, and say which setting holds the bad value. */
            static const char prefix[] = "tb_current_device: ";
            char reason[TB__ERROR_CAP];
            const char *source = tb__g.device_source != NULL ? tb__g.device_source : "TB_DEVICE";
            const char *r = tb_last_error();
            if (strncmp(r, prefix, sizeof prefix - 1) == 0) r += sizeof prefix - 1;
            snprintf(reason, sizeof reason, "%s", r);
            return tb__error(st, "tb_current_device: %s='%.64s' is not a usable device: %s", source,
                             desc->device, reason);
        }
        *out = d;
        return TB_OK;
    }
    {
        const tb_backend *b = tb__current_backend("tb_current_device");
        if (b == NULL) return tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_NOT_FOUND;
        return tb_backend_default_device(tb_backend_name(b), out);
    }
}

TBDEF tb_status tb_device_guard_begin(tb_device_guard *guard, const tb_device *device) {
    tb_device d;
    tb_status st;
    if (guard == NULL || device == NULL) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_device_guard_begin: %s is NULL",
                         guard == NULL ? "guard" : "device");
    }
    tb__ensure_setup();
    if (device->backend[0] == '\0') {
        st = tb_current_device(&d);
    } else {
        char name[TB_MAX_NAME + 1];
        memcpy(name, device->backend, TB_MAX_NAME);
        name[TB_MAX_NAME] = '\0';
        st = tb__backend_device("tb_device_guard_begin", name, device->ordinal, &d);
    }
    if (st != TB_OK) return st;
    guard->previous = tb__guard_device;
    guard->had_previous = tb__guard_active;
    guard->active = true;
    tb__guard_device = d;
    tb__guard_active = true;
    return TB_OK;
}

TBDEF void tb_device_guard_end(tb_device_guard *guard) {
    if (guard == NULL || !guard->active) return;
    tb__guard_device = guard->previous;
    tb__guard_active = guard->had_previous;
    guard->active = false;
}
