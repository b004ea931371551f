// Build: cc -std=c99 -shared -fPIC -I. examples/plugin_backend.c -o libtb_backend_plugin.so
//        (from the repository root)
/* A backend as a plugin: a shared object the library loads on demand.

   Put libtb_backend_plugin.so in a folder listed in TB_BACKEND_PATH; the first
   tb_backend_lookup("plugin") (or TB_BACKEND=plugin, or a device "plugin:0") finds it, calls
   tb_backend_plugin_entry, checks the API version and the name, and registers the backend.

   The object carries its own static copy of the library (TB_STATIC + TB_IMPLEMENTATION) only
   for the pure helpers it uses (node accessors, dtype sizes, shape comparison). Everything that
   has to reach the host program goes through the tb_plugin_host functions: errors (so that the
   host's tb_last_error shows them; tb_set_error of the plugin's own copy would reach the host
   too, see the README's "Plugins"), logging and memory (so that the host's allocator hooks see
   every allocation). The backend itself keeps arrays in host memory and runs f32 add, mul, neg
   and relu on operands of equal shapes; every other node falls back to the host's reference
   backend. examples/fake_backend.c explains each vtable entry in detail. */
#define TB_STATIC
#define TB_NO_OPENCL
#define TB_NO_PLUGINS
#define TB_IMPLEMENTATION
#include "torch_backend.h"

#include <stdio.h>
#include <string.h>

static const tb_plugin_host *plugin_host;

typedef struct plugin_buffer {
    void *data;
    size_t size;
} plugin_buffer;

enum plugin_kind { PLUGIN_PARAM, PLUGIN_ADD, PLUGIN_MUL, PLUGIN_NEG, PLUGIN_RELU };

typedef struct plugin_step {
    enum plugin_kind kind;
    size_t arg, a, b, nbytes;
    int64_t numel;
} plugin_step;

typedef struct plugin_program {
    plugin_step *steps;
    size_t num_steps, num_params, num_results;
    size_t *results;
} plugin_program;

typedef struct plugin_context {
    plugin_program *program;
} plugin_context;

static void *plugin_alloc(size_t size) {
    return plugin_host->alloc(size > 0 ? size : 1);
}

static void *plugin_calloc(size_t count, size_t size) {
    void *p;
    if (size != 0 && count > (size_t)-1 / size) return NULL;
    p = plugin_alloc(count * size);
    if (p != NULL) memset(p, 0, count * size > 0 ? count * size : 1);
    return p;
}

static void plugin_free(void *p) {
    if (p != NULL) plugin_host->free(p);
}

static tb_status plugin_error(tb_status status, const char *message) {
    return plugin_host->set_error(status, message);
}

/* Element count and byte size of a shape the host already checked. */
static void plugin_sizes(const tb_shape *shape, int64_t *numel, size_t *nbytes) {
    int64_t n = 1;
    int32_t i;
    for (i = 0; i < shape->rank; i++)
        n *= shape->dims[i];
    *numel = n;
    *nbytes = (size_t)n * tb_dtype_size(shape->dtype);
}

static plugin_buffer *plugin_buffer_new(size_t size) {
    plugin_buffer *b = (plugin_buffer *)plugin_alloc(sizeof *b);
    if (b == NULL) return NULL;
    b->data = plugin_alloc(size);
    if (b->data == NULL) {
        plugin_free(b);
        return NULL;
    }
    b->size = size;
    return b;
}

static void plugin_buffer_free(plugin_buffer *b) {
    if (b == NULL) return;
    plugin_free(b->data);
    plugin_free(b);
}

static void plugin_program_free(plugin_program *p) {
    if (p == NULL) return;
    plugin_free(p->steps);
    plugin_free(p->results);
    plugin_free(p);
}

static size_t plugin_index_of(const tb_node *const *nodes, size_t n, const tb_node *node) {
    size_t i;
    for (i = 0; i < n; i++) {
        if (nodes[i] == node) return i;
    }
    return n;
}

static bool plugin_same_f32(const tb_node *node, const tb_node *other) {
    return tb_node_shape(node)->dtype == TB_F32 &&
           tb_shape_equal(tb_node_shape(node), tb_node_shape(other));
}

static tb_status plugin_init(void *user_data) {
    (void)user_data;
    plugin_host->log(TB_LOG_DEBUG, "plugin: init");
    return TB_OK;
}

static bool plugin_supports_node(void *user_data, const tb_node *node) {
    (void)user_data;
    switch (tb_node_op(node)) {
    case TB_OP_DEVICE_DATA:
    case TB_OP_SCALAR:
        return true;
    case TB_OP_ADD:
    case TB_OP_MUL:
        return plugin_same_f32(tb_node_operand(node, 0), node) &&
               plugin_same_f32(tb_node_operand(node, 1), node);
    case TB_OP_NEG:
    case TB_OP_RELU:
        return plugin_same_f32(tb_node_operand(node, 0), node);
    default:
        return false;
    }
}

static tb_status plugin_data_from_host(void *user_data, tb_backend_data *data, const void *host) {
    int64_t numel;
    size_t nbytes;
    plugin_buffer *b;
    (void)user_data;
    plugin_sizes(&data->shape, &numel, &nbytes);
    b = plugin_buffer_new(nbytes);
    if (b == NULL) return plugin_error(TB_ERR_OUT_OF_MEMORY, "plugin: out of memory");
    if (nbytes > 0) memcpy(b->data, host, nbytes);
    data->payload = b;
    return TB_OK;
}

static tb_status plugin_data_to_host(void *user_data, const tb_backend_data *data, void *host) {
    const plugin_buffer *b = (const plugin_buffer *)data->payload;
    (void)user_data;
    if (b->size > 0) memcpy(host, b->data, b->size);
    return TB_OK;
}

static void plugin_data_release(void *user_data, tb_backend_data *data) {
    (void)user_data;
    plugin_buffer_free((plugin_buffer *)data->payload);
    data->payload = NULL;
}

static tb_status plugin_create_lowering_context(void *user_data, const tb_graph *graph,
                                                void **context) {
    plugin_context *ctx = (plugin_context *)plugin_calloc(1, sizeof *ctx);
    plugin_program *p = (plugin_program *)plugin_calloc(1, sizeof *p);
    size_t i;
    (void)user_data;
    if (ctx != NULL && p != NULL) {
        p->steps = (plugin_step *)plugin_calloc(graph->num_nodes + 1, sizeof *p->steps);
        p->results = (size_t *)plugin_calloc(graph->num_results + 1, sizeof *p->results);
    }
    if (ctx == NULL || p == NULL || p->steps == NULL || p->results == NULL) {
        plugin_program_free(p);
        plugin_free(ctx);
        return plugin_error(TB_ERR_OUT_OF_MEMORY, "plugin: out of memory");
    }
    ctx->program = p;
    p->num_steps = graph->num_nodes;
    p->num_params = graph->num_parameters;
    p->num_results = graph->num_results;
    for (i = 0; i < graph->num_nodes; i++) {
        const tb_node *node = graph->nodes[i];
        plugin_step *step = &p->steps[i];
        size_t param = plugin_index_of(graph->parameters, graph->num_parameters, node);
        plugin_sizes(tb_node_shape(node), &step->numel, &step->nbytes);
        if (param < graph->num_parameters) {
            step->kind = PLUGIN_PARAM;
            step->arg = param;
            continue;
        }
        switch (tb_node_op(node)) {
        case TB_OP_ADD:
            step->kind = PLUGIN_ADD;
            break;
        case TB_OP_MUL:
            step->kind = PLUGIN_MUL;
            break;
        case TB_OP_NEG:
            step->kind = PLUGIN_NEG;
            break;
        case TB_OP_RELU:
            step->kind = PLUGIN_RELU;
            break;
        default:
            plugin_program_free(p);
            plugin_free(ctx);
            return plugin_error(TB_ERR_UNSUPPORTED, "plugin: cannot lower this op");
        }
        step->a = plugin_index_of(graph->nodes, i, tb_node_operand(node, 0));
        step->b = tb_node_num_operands(node) > 1
                      ? plugin_index_of(graph->nodes, i, tb_node_operand(node, 1))
                      : step->a;
    }
    for (i = 0; i < graph->num_results; i++) {
        p->results[i] = plugin_index_of(graph->nodes, graph->num_nodes, graph->results[i]);
    }
    *context = ctx;
    return TB_OK;
}

static void plugin_release_lowering_context(void *user_data, void *context) {
    plugin_context *ctx = (plugin_context *)context;
    (void)user_data;
    plugin_program_free(ctx->program);
    plugin_free(ctx);
}

static tb_status plugin_compile(void *user_data, void *context, void **computation) {
    plugin_context *ctx = (plugin_context *)context;
    (void)user_data;
    *computation = ctx->program;
    ctx->program = NULL;
    return TB_OK;
}

static tb_status plugin_execute(void *user_data, void *computation,
                                tb_backend_data *const *arguments, size_t num_arguments,
                                tb_backend_data *const *results, size_t num_results) {
    plugin_program *p = (plugin_program *)computation;
    void **slots;
    tb_status st = TB_OK;
    size_t i;
    (void)user_data;
    if (num_arguments != p->num_params || num_results != p->num_results) {
        return plugin_error(TB_ERR_EXECUTE, "plugin: wrong number of arguments or results");
    }
    slots = (void **)plugin_calloc(p->num_steps + 1, sizeof *slots);
    if (slots == NULL) return plugin_error(TB_ERR_OUT_OF_MEMORY, "plugin: out of memory");
    for (i = 0; i < p->num_steps; i++) {
        const plugin_step *step = &p->steps[i];
        const float *a, *b;
        float *out;
        int64_t k;
        if (step->kind == PLUGIN_PARAM) {
            slots[i] = ((plugin_buffer *)arguments[step->arg]->payload)->data;
            continue;
        }
        slots[i] = plugin_alloc(step->nbytes);
        if (slots[i] == NULL) {
            st = plugin_error(TB_ERR_OUT_OF_MEMORY, "plugin: out of memory");
            break;
        }
        a = (const float *)slots[step->a];
        b = (const float *)slots[step->b];
        out = (float *)slots[i];
        for (k = 0; k < step->numel; k++) {
            switch (step->kind) {
            case PLUGIN_ADD:
                out[k] = a[k] + b[k];
                break;
            case PLUGIN_MUL:
                out[k] = a[k] * b[k];
                break;
            case PLUGIN_NEG:
                out[k] = -a[k];
                break;
            case PLUGIN_RELU:
                out[k] = a[k] > 0.0f ? a[k] : 0.0f;
                break;
            case PLUGIN_PARAM:
                break;
            }
        }
    }
    for (i = 0; i < num_results && st == TB_OK; i++) {
        const plugin_step *step = &p->steps[p->results[i]];
        plugin_buffer *b = plugin_buffer_new(step->nbytes);
        if (b == NULL) {
            st = plugin_error(TB_ERR_OUT_OF_MEMORY, "plugin: out of memory");
            break;
        }
        if (step->nbytes > 0) memcpy(b->data, slots[p->results[i]], step->nbytes);
        results[i]->payload = b;
    }
    if (st != TB_OK) {
        for (i = 0; i < num_results; i++) {
            plugin_buffer_free((plugin_buffer *)results[i]->payload);
            results[i]->payload = NULL;
        }
    }
    for (i = 0; i < p->num_steps; i++) {
        if (p->steps[i].kind != PLUGIN_PARAM) plugin_free(slots[i]);
    }
    plugin_free(slots);
    return st;
}

static void plugin_release_computation(void *user_data, void *computation) {
    (void)user_data;
    plugin_program_free((plugin_program *)computation);
}

static size_t plugin_get_backend_devices(void *user_data, tb_device *out, size_t cap) {
    (void)user_data;
    if (cap > 0) {
        out[0].type = TB_DEVICE_ACCELERATOR;
        out[0].ordinal = 0;
    }
    return 1;
}

static tb_status plugin_get_device_info(void *user_data, int32_t ordinal, tb_device_info *out) {
    (void)user_data;
    (void)ordinal;
    snprintf(out->name, sizeof out->name, "plugin device");
    snprintf(out->vendor, sizeof out->vendor, "example plugin");
    out->unified_memory = true;
    return TB_OK;
}

#if defined(__GNUC__) || defined(__clang__)
__attribute__((visibility("default")))
#endif
tb_status
tb_backend_plugin_entry(const tb_plugin_host *host, tb_plugin_desc *out);

tb_status tb_backend_plugin_entry(const tb_plugin_host *host, tb_plugin_desc *out) {
    if (host == NULL || out == NULL) return TB_ERR_INVALID_ARGUMENT;
    if (host->api_version != TB_API_VERSION) {
        return host->set_error(TB_ERR_PLUGIN, "plugin: built for another API version");
    }
    plugin_host = host;
    memset(out, 0, sizeof *out);
    out->api_version = TB_API_VERSION;
    out->name = "plugin";
    out->tags = "example";
    out->impl.init = plugin_init;
    out->impl.supports_node = plugin_supports_node;
    out->impl.data_from_host = plugin_data_from_host;
    out->impl.data_to_host = plugin_data_to_host;
    out->impl.data_release = plugin_data_release;
    out->impl.create_lowering_context = plugin_create_lowering_context;
    out->impl.release_lowering_context = plugin_release_lowering_context;
    out->impl.compile = plugin_compile;
    out->impl.execute = plugin_execute;
    out->impl.release_computation = plugin_release_computation;
    out->impl.get_backend_devices = plugin_get_backend_devices;
    out->impl.get_device_info = plugin_get_device_info;
    return TB_OK;
}
