/* A plugin that reports its errors only through tb_set_error of its own copy of the library
   (TB_STATIC + TB_IMPLEMENTATION), never through host->set_error: the host must still show
   them in its tb_last_error. Built by tests/plugins/build.sh, once per variant:
     -DTB_TEST_SETERROR        libtb_backend_seterror.so: loads; keeps arrays in host memory;
                               lowering and compiling work, execute fails with a message
     -DTB_TEST_SETERRORENTRY   libtb_backend_seterrorentry.so: the entry fails with a message
     -DTB_TEST_SETERRORINIT    libtb_backend_seterrorinit.so: init fails with a message */
#define TB_STATIC
#define TB_NO_OPENCL
#define TB_NO_PLUGINS
#define TB_IMPLEMENTATION
#include "torch_backend.h"

#include <stdlib.h>
#include <string.h>

#if defined(TB_TEST_SETERROR)
#define SETERROR_NAME "seterror"
#elif defined(TB_TEST_SETERRORENTRY)
#define SETERROR_NAME "seterrorentry"
#elif defined(TB_TEST_SETERRORINIT)
#define SETERROR_NAME "seterrorinit"
#else
#error "define one TB_TEST_SETERROR* variant (see the top of this file)"
#endif

static tb_status seterror_init(void *user_data) {
    (void)user_data;
#if defined(TB_TEST_SETERRORINIT)
    return tb_set_error(TB_ERR_UNAVAILABLE, "seterrorinit: the card is not plugged in");
#else
    return TB_OK;
#endif
}

static tb_status seterror_from_host(void *user_data, tb_backend_data *data, const void *host) {
    size_t nbytes = 0;
    void *copy;
    (void)user_data;
    if (tb_shape_nbytes(&data->shape, &nbytes) != TB_OK) return tb_last_status();
    copy = malloc(nbytes > 0 ? nbytes : 1);
    if (copy == NULL) return tb_set_error(TB_ERR_OUT_OF_MEMORY, "seterror: out of memory");
    if (nbytes > 0) memcpy(copy, host, nbytes);
    data->payload = copy;
    return TB_OK;
}

static tb_status seterror_to_host(void *user_data, const tb_backend_data *data, void *host) {
    size_t nbytes = 0;
    (void)user_data;
    if (tb_shape_nbytes(&data->shape, &nbytes) != TB_OK) return tb_last_status();
    if (nbytes > 0) memcpy(host, data->payload, nbytes);
    return TB_OK;
}

static void seterror_release(void *user_data, tb_backend_data *data) {
    (void)user_data;
    free(data->payload);
    data->payload = NULL;
}

static int seterror_token;

static tb_status seterror_lower(void *user_data, const tb_graph *graph, void **context) {
    (void)user_data;
    (void)graph;
    *context = &seterror_token;
    return TB_OK;
}

static tb_status seterror_compile(void *user_data, void *context, void **computation) {
    (void)user_data;
    *computation = context;
    return TB_OK;
}

static tb_status seterror_execute(void *user_data, void *computation,
                                  tb_backend_data *const *arguments, size_t num_arguments,
                                  tb_backend_data *const *results, size_t num_results) {
    (void)user_data;
    (void)computation;
    (void)arguments;
    (void)num_arguments;
    (void)results;
    (void)num_results;
    return tb_set_error(TB_ERR_EXECUTE, "seterror: the device fell off the bus");
}

static void seterror_release_computation(void *user_data, void *computation) {
    (void)user_data;
    (void)computation;
}

static size_t seterror_devices(void *user_data, tb_device *out, size_t cap) {
    (void)user_data;
    if (cap > 0) {
        out[0].type = TB_DEVICE_ACCELERATOR;
        out[0].ordinal = 0;
    }
    return 1;
}

#if defined(__GNUC__) || defined(__clang__)
__attribute__((visibility("default")))
#endif
tb_status
tb_backend_plugin_entry(const tb_plugin_host *host, tb_plugin_desc *out);

tb_status tb_backend_plugin_entry(const tb_plugin_host *host, tb_plugin_desc *out) {
    (void)host;
    memset(out, 0, sizeof *out);
    out->api_version = TB_API_VERSION;
    out->name = SETERROR_NAME;
    out->tags = "debug";
    out->impl.init = seterror_init;
    out->impl.data_from_host = seterror_from_host;
    out->impl.data_to_host = seterror_to_host;
    out->impl.data_release = seterror_release;
    out->impl.create_lowering_context = seterror_lower;
    out->impl.compile = seterror_compile;
    out->impl.execute = seterror_execute;
    out->impl.release_computation = seterror_release_computation;
    out->impl.get_backend_devices = seterror_devices;
#if defined(TB_TEST_SETERRORENTRY)
    return tb_set_error(TB_ERR_UNSUPPORTED, "seterrorentry: firmware 0.9 is too old");
#else
    return TB_OK;
#endif
}
