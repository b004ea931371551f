/* ===========================================================================================
   Device resolution: a device's text or backend name and ordinal checked against the registry,
   the current device (guard, desc.device / $TB_DEVICE, else the current backend's default),
   and the per-thread device guard. Every part resolves devices here.
   =========================================================================================== */
#include "../impl_begin.h"

/* The calling thread's innermost guarded device. */
static TB__THREAD_LOCAL tb_device tb__guard_device;
static TB__THREAD_LOCAL bool tb__guard_active = false;

TBDEF tb_status tb_device_make(const char *backend, int32_t ordinal, tb_device *out) {
    if (backend == NULL || out == NULL) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_device_make: %s is NULL",
                         backend == NULL ? "backend" : "out");
    }
    tb__ensure_setup();
    return tb__backend_device("tb_device_make", backend, ordinal, out);
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

/* The device a caller gave: the current one when its backend is empty, else its backend and
   ordinal checked against the registry (messages name `fn`). */
static tb_status tb__device_given(const char *fn, const tb_device *device, tb_device *out) {
    char name[TB_MAX_NAME + 1];
    if (device->backend[0] == '\0') return tb_current_device(out);
    memcpy(name, device->backend, TB_MAX_NAME);
    name[TB_MAX_NAME] = '\0';
    return tb__backend_device(fn, name, device->ordinal, out);
}

TBDEF tb_status tb_device_guard_begin(tb_device_guard *guard, const tb_device *device) {
    tb_device d;
    tb_status st;
    if (guard == NULL || device == NULL) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_device_guard_begin: %s is NULL",
                         guard == NULL ? "guard" : "device");
    }
    tb__ensure_setup();
    st = tb__device_given("tb_device_guard_begin", device, &d);
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

static tb_status tb__resolve_device(const tb_device *device, tb_device *out) {
    tb_device made;
    tb_status st;
    if (device == NULL || device->backend[0] == '\0') return tb_current_device(out);
    if (memchr(device->backend, '\0', sizeof(device->backend)) == NULL) {
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "tb_device: the backend name is not NUL-terminated within %d bytes",
                         TB_MAX_NAME + 1);
    }
    st = tb_device_make(device->backend, device->ordinal, &made);
    if (st != TB_OK) return st;
    *out = made;
    return TB_OK;
}

TBDEF tb_status tb_backend_device_info(const tb_device *device, tb_device_info *out) {
    tb_device d;
    tb_status st;
    tb_backend *b;
    if (device == NULL || out == NULL) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_backend_device_info: %s is NULL",
                         device == NULL ? "device" : "out");
    }
    st = tb__device_given("tb_backend_device_info", device, &d);
    if (st != TB_OK) return st;
    b = tb__lookup("tb_backend_device_info", d.backend);
    if (b == NULL) return tb_last_status();
    memset(out, 0, sizeof *out);
    out->device = d;
    if (b->impl.get_device_info != NULL) {
        tb__saved_error saved;
        tb__error_save(&saved);
        tb_clear_error();
        st = b->impl.get_device_info(b->impl.user_data, d.ordinal, out);
        if (st != TB_OK) return tb__backend_failed(st, b, "get_device_info");
        tb__error_restore(&saved);
        out->device = d;
        /* whatever the backend wrote, the strings end inside their arrays */
        out->name[sizeof out->name - 1] = '\0';
        out->vendor[sizeof out->vendor - 1] = '\0';
        out->driver_version[sizeof out->driver_version - 1] = '\0';
        out->language_version[sizeof out->language_version - 1] = '\0';
        out->extensions[sizeof out->extensions - 1] = '\0';
    }
    return TB_OK;
}
