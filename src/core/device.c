/* ===========================================================================================
   Devices: types, the text form `backend:ordinal`, equality (resolution through the registry
   is device_resolve.c's)
   =========================================================================================== */
#include "../impl_begin.h"

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

TBDEF bool tb_device_equal(const tb_device *a, const tb_device *b) {
    if (a == NULL || b == NULL) return false;
    return a->ordinal == b->ordinal && strncmp(a->backend, b->backend, sizeof a->backend) == 0;
}
