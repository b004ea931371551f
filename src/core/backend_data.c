/* ===========================================================================================
   Backend data: the handles of backend values (host-mapped, borrowed, scalar), their
   references and transfers, through the owning backend's entries.
   =========================================================================================== */
#include "../impl_begin.h"

/* ---- backend data ---- */

/* The host address of a data's values, from its backend when that keeps them in host memory
   (tb_backend_impl.data_host_pointer); NULL otherwise. */
static TB__UNUSED void *tb__host_data(const tb_backend_data *data) {
    const tb_backend_impl *impl;
    if (data == NULL || data->payload == NULL || data->tb__backend == NULL) return NULL;
    impl = &data->tb__backend->impl;
    if (impl->data_host_pointer == NULL) return NULL;
    return impl->data_host_pointer(impl->user_data, data);
}

static TB__UNUSED tb_backend_data *tb__data_new(const tb_backend *backend, const tb_device *device,
                                                const tb_shape *shape) {
    tb_backend_data *d = (tb_backend_data *)tb__calloc(1, sizeof *d);
    if (d == NULL) return NULL;
    d->device = *device;
    d->shape = *shape;
    d->tb__refcount = 1;
    d->tb__backend = backend;
    return d;
}

static TB__UNUSED void tb__data_retain(tb_backend_data *data) {
    if (data != NULL) TB__ATOMIC_ADD(&data->tb__refcount, 1);
}

static TB__UNUSED void tb__data_release(tb_backend_data *data) {
    if (data == NULL) return;
    if (TB__ATOMIC_ADD(&data->tb__refcount, -1) != 0) return;
    if (data->payload != NULL && data->tb__backend != NULL) {
        const tb_backend_impl *impl = &data->tb__backend->impl;
        impl->data_release(impl->user_data, data);
    }
    tb__free(data);
}

/* Frees a data that never left this file after its backend entry failed. */
static void tb__data_discard(tb_backend_data *data) {
    tb__saved_error saved;
    tb__error_save(&saved);
    tb__data_release(data);
    tb__error_restore(&saved);
}

static TB__UNUSED tb_backend_data *tb__data_from_host(const tb_device *device,
                                                      const tb_shape *shape, const void *host) {
    tb_backend *b;
    tb_backend_data *d;
    size_t nbytes = 0;
    uint64_t t0;
    tb_status st;
    tb__saved_error saved;
    if (tb__shape_check("tb_tensor_from_host", shape) != TB_OK) return NULL;
    tb_shape_nbytes(shape, &nbytes);
    if (host == NULL && nbytes > 0) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "tb_tensor_from_host: data is NULL");
        return NULL;
    }
    b = tb__backend_for_device(device);
    if (b == NULL) return NULL;
    d = tb__data_new(b, device, shape);
    if (d == NULL) return NULL;
    tb__error_save(&saved);
    tb_clear_error();
    t0 = tb__now_ns();
    st = b->impl.data_from_host(b->impl.user_data, d, host);
    if (st != TB_OK) {
        tb__backend_failed(st, b, "data_from_host");
        tb__data_discard(d);
        return NULL;
    }
    tb__error_restore(&saved);
    tb__metric_sample("TransferToDeviceTime", (double)(tb__now_ns() - t0));
    tb__metric_count("CreateDataHandles", 1);
    return d;
}

/* A rank-0 data holding a scalar (LTC MakeComputationDataFromScalar); without a
   data_from_scalar entry the value is converted on the host and copied. */
static TB__UNUSED tb_backend_data *tb__data_from_scalar(const tb_device *device, tb_scalar value) {
    tb_backend *b;
    tb_backend_data *d;
    tb_shape shape;
    uint64_t t0;
    tb_status st;
    tb__saved_error saved;
    if (!tb_dtype_is_valid(value.dtype)) {
        tb__error(TB_ERR_DTYPE, "tb_scalar: invalid dtype %d", (int)value.dtype);
        return NULL;
    }
    b = tb__backend_for_device(device);
    if (b == NULL) return NULL;
    memset(&shape, 0, sizeof shape);
    shape.dtype = value.dtype;
    d = tb__data_new(b, device, &shape);
    if (d == NULL) return NULL;
    d->is_scalar = true;
    d->scalar = value;
    tb__error_save(&saved);
    tb_clear_error();
    t0 = tb__now_ns();
    if (b->impl.data_from_scalar != NULL) {
        st = b->impl.data_from_scalar(b->impl.user_data, d, value);
    } else {
        unsigned char bytes[8];
        tb__scalar_store(value, value.dtype, bytes);
        st = b->impl.data_from_host(b->impl.user_data, d, bytes);
    }
    if (st != TB_OK) {
        tb__backend_failed(
            st, b, b->impl.data_from_scalar != NULL ? "data_from_scalar" : "data_from_host");
        tb__data_discard(d);
        return NULL;
    }
    tb__error_restore(&saved);
    tb__metric_sample("TransferToDeviceTime", (double)(tb__now_ns() - t0));
    tb__metric_count("CreateDataHandles", 1);
    return d;
}

/* A data of the device's backend that uses `host` in place, when the backend can
   (tb_backend_impl.data_borrow_host); `release(context)` is then the data's to call. NULL without
   an error, nothing called, when it cannot: the caller copies instead (which also reports any
   error of the device) and keeps `release`. */
static TB__UNUSED tb_backend_data *tb__data_borrow_host(const tb_device *device,
                                                        const tb_shape *shape, const void *host,
                                                        void (*release)(void *context),
                                                        void *context) {
    tb_backend *b;
    tb_backend_data *d;
    void *writable;
    tb_status st;
    tb__saved_error saved;
    if (device == NULL || shape == NULL || host == NULL) return NULL;
    tb__error_save(&saved);
    b = tb__backend_for_device(device);
    if (b == NULL || b->impl.data_borrow_host == NULL) {
        tb__error_restore(&saved);
        return NULL;
    }
    d = tb__data_new(b, device, shape);
    if (d == NULL) {
        tb__error_restore(&saved);
        return NULL;
    }
    /* The caller promised the array outlives the data; the backend gives the const back on
       read (tb_tensor_from_host_borrowed's contract: the library never writes through it). */
    memcpy(&writable, &host, sizeof writable);
    st = b->impl.data_borrow_host(b->impl.user_data, d, writable, release, context);
    if (st != TB_OK || d->payload == NULL) {
        d->payload = NULL;
        tb__data_discard(d);
        tb__error_restore(&saved);
        return NULL;
    }
    d->tb__shared = true;
    tb__error_restore(&saved);
    tb__metric_count("CreateDataHandles", 1);
    return d;
}

/* The host address of a data's values for one host step (tb_backend_impl.data_map_host), read
   only: NULL without an error when the backend cannot give one without a copy. */
static TB__UNUSED void *tb__data_map_host(tb_backend_data *data) {
    const tb_backend_impl *impl;
    tb__saved_error saved;
    void *host;
    if (data == NULL || data->payload == NULL || data->tb__backend == NULL) return NULL;
    impl = &data->tb__backend->impl;
    if (impl->data_map_host == NULL) return NULL;
    tb__error_save(&saved);
    host = impl->data_map_host(impl->user_data, data, false);
    tb__error_restore(&saved);
    return host;
}

/* Ends a tb__data_map_host or tb__data_new_mapped (`host` is what it gave). */
static TB__UNUSED tb_status tb__data_unmap_host(tb_backend_data *data, void *host) {
    const tb_backend_impl *impl;
    if (data == NULL || host == NULL || data->tb__backend == NULL) return TB_OK;
    impl = &data->tb__backend->impl;
    if (impl->data_unmap_host == NULL) return TB_OK;
    return impl->data_unmap_host(impl->user_data, data, host);
}

/* A new data of the device's backend whose values the caller writes in place at *host (every
   value, then tb__data_unmap_host before any other use). NULL without an error, nothing kept,
   when the backend cannot give host memory without a copy: the caller writes a host array and
   copies it with tb__data_from_host instead (which also reports any error of the device). */
static TB__UNUSED tb_backend_data *tb__data_new_mapped(const tb_device *device,
                                                       const tb_shape *shape, void **host) {
    tb_backend *b;
    tb_backend_data *d;
    tb__saved_error saved;
    *host = NULL;
    if (device == NULL || shape == NULL) return NULL;
    tb__error_save(&saved);
    b = tb__backend_for_device(device);
    if (b == NULL || b->impl.data_map_host == NULL) {
        tb__error_restore(&saved);
        return NULL;
    }
    d = tb__data_new(b, device, shape);
    if (d != NULL) *host = b->impl.data_map_host(b->impl.user_data, d, true);
    if (d != NULL && (*host == NULL || d->payload == NULL)) {
        tb__data_discard(d);
        d = NULL;
        *host = NULL;
    }
    tb__error_restore(&saved);
    if (d != NULL) tb__metric_count("CreateDataHandles", 1);
    return d;
}

static TB__UNUSED tb_status tb__data_to_host(const tb_backend_data *data, void *host) {
    const tb_backend *b;
    size_t nbytes = 0;
    uint64_t t0;
    tb_status st;
    tb__saved_error saved;
    if (data == NULL || data->tb__backend == NULL) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_tensor_to_host: data is NULL");
    }
    b = data->tb__backend;
    st = tb__shape_check("tb_tensor_to_host", &data->shape);
    if (st != TB_OK) return st;
    tb_shape_nbytes(&data->shape, &nbytes);
    if (host == NULL && nbytes > 0) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_tensor_to_host: destination is NULL");
    }
    if (data->payload == NULL) {
        return tb__error(TB_ERR_STATE,
                         "tb_tensor_to_host: the data on backend '%s' has no value "
                         "yet (a placeholder)",
                         b->name);
    }
    tb__error_save(&saved);
    tb_clear_error();
    t0 = tb__now_ns();
    st = b->impl.data_to_host(b->impl.user_data, data, host);
    if (st != TB_OK) return tb__backend_failed(st, b, "data_to_host");
    tb__error_restore(&saved);
    tb__metric_sample("TransferFromDeviceTime", (double)(tb__now_ns() - t0));
    return TB_OK;
}
