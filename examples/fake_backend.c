// test: run
// Build: cc -std=c99 -I. examples/fake_backend.c -o fake_backend -ldl -lpthread -lm
//    or: c++ -x c++ -std=c++11 -I. examples/fake_backend.c -o fake_backend -ldl -lpthread -lm
//        (both from the repository root)
// Run:   ./fake_backend
/* A complete, minimal backend: the file to copy when you start a backend for your own device.

   It keeps arrays in host memory (where your backend would hold device buffers) and runs four
   f32 elementwise ops itself (add, mul, neg, relu on operands of equal shapes). For every other
   node supports_node answers false, and the library runs that node on its reference backend
   (the eager fallback) and hands the value back as a parameter. Every entry of tb_backend_impl
   is filled in and explained, optional ones included; an entry you leave NULL gets the
   library's default described in torch_backend.h.

   The program registers the backend as "fake" (tagged "experimental", so tb_backend_list hides
   it unless asked), builds a small graph on fake:0, syncs it and checks the result. */
#define TB_IMPLEMENTATION
#include "torch_backend.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the backend's state: one per registration, handed to every entry as user_data ---- */

#define FAKE_NUM_DEVICES 2

typedef struct fake_state {
    tb_device_type default_type;
    int32_t default_ordinal;
    uint64_t seed;
    int nodes_created;
    int compiles;
    int executions;
} fake_state;

/* The payload of a tb_backend_data: a device buffer on real hardware. */
typedef struct fake_buffer {
    void *data;
    size_t size;
    /* a caller's array used in place (data_borrow_host): not freed, handed back instead */
    void (*release)(void *context);
    void *release_context;
    int borrowed;
} fake_buffer;

static fake_buffer *fake_buffer_new(size_t size) {
    fake_buffer *b = (fake_buffer *)malloc(sizeof *b);
    if (b == NULL) return NULL;
    b->data = malloc(size > 0 ? size : 1);
    if (b->data == NULL) {
        free(b);
        return NULL;
    }
    b->size = size;
    b->release = NULL;
    b->release_context = NULL;
    b->borrowed = 0;
    return b;
}

static void fake_buffer_free(fake_buffer *b) {
    if (b == NULL) return;
    if (!b->borrowed) free(b->data);
    if (b->borrowed && b->release != NULL) b->release(b->release_context);
    free(b);
}

/* ---- a compiled program: one step per graph node, values in numbered slots ---- */

enum fake_step_kind { FAKE_PARAM, FAKE_ADD, FAKE_MUL, FAKE_NEG, FAKE_RELU };

typedef struct fake_step {
    enum fake_step_kind kind;
    size_t arg;    /* FAKE_PARAM: which execute argument */
    size_t a, b;   /* the operands' slots */
    size_t nbytes; /* size of this node's value */
    int64_t numel;
} fake_step;

typedef struct fake_program {
    fake_step *steps; /* slot i holds the value of graph node i */
    size_t num_steps;
    size_t *results; /* the slot of each result */
    size_t num_results;
    size_t num_params;
    char *text;
} fake_program;

/* The lowering context holds the program until compile takes it. */
typedef struct fake_context {
    fake_program *program;
} fake_context;

static void fake_program_free(fake_program *p) {
    if (p == NULL) return;
    free(p->steps);
    free(p->results);
    free(p->text);
    free(p);
}

/* The position of `node` in `nodes`, or n when absent. A real backend would use a hash map
   (graphs can have many thousands of nodes); linear search keeps this file short. */
static size_t fake_index_of(const tb_node *const *nodes, size_t n, const tb_node *node) {
    size_t i;
    for (i = 0; i < n; i++) {
        if (nodes[i] == node) return i;
    }
    return n;
}

static bool fake_is_f32_like(const tb_node *node, const tb_node *other) {
    const tb_shape *s = tb_node_shape(node), *o = tb_node_shape(other);
    return s->dtype == TB_F32 && tb_shape_equal(s, o);
}

/* ---- the vtable entries, in the order of tb_backend_impl ---- */

/* init (optional): runs once at registration; an error rejects the registration. Open your
   driver here and fail with a reason when the hardware is missing. */
static tb_status fake_init(void *user_data) {
    fake_state *s = (fake_state *)user_data;
    s->default_type = TB_DEVICE_ACCELERATOR;
    s->default_ordinal = 0;
    printf("fake: init (%d devices)\n", FAKE_NUM_DEVICES);
    return TB_OK;
}

/* prepare_to_exit (optional): tb_shutdown calls it once, after the library released its
   computations and data. Close queues and contexts here. */
static void fake_prepare_to_exit(void *user_data) {
    fake_state *s = (fake_state *)user_data;
    printf("fake: prepare_to_exit after %d compiles and %d executions\n", s->compiles,
           s->executions);
}

/* set_rng_seed (optional): tb_manual_seed. Only backends that generate random numbers
   themselves need it (they must produce the library's Philox stream). */
static void fake_set_rng_seed(void *user_data, uint64_t seed) {
    ((fake_state *)user_data)->seed = seed;
}

/* on_node_created (optional): sees every node recorded on this backend's devices; an error
   makes the op return NULL. Useful to reject what the hardware can never do, early. */
static tb_status fake_on_node_created(void *user_data, const tb_node *node) {
    (void)node;
    ((fake_state *)user_data)->nodes_created++;
    return TB_OK;
}

/* supports_node (optional): false sends the node to the reference backend (eager fallback;
   counted in the metrics as Fallback::<op>). NULL means every node is supported. */
static bool fake_supports_node(void *user_data, const tb_node *node) {
    (void)user_data;
    switch (tb_node_op(node)) {
    case TB_OP_DEVICE_DATA:
    case TB_OP_SCALAR:
        return true; /* leaves: their values arrive as execute arguments */
    case TB_OP_ADD:
    case TB_OP_MUL:
        return fake_is_f32_like(tb_node_operand(node, 0), node) &&
               fake_is_f32_like(tb_node_operand(node, 1), node);
    case TB_OP_NEG:
    case TB_OP_RELU:
        return fake_is_f32_like(tb_node_operand(node, 0), node);
    default:
        return false;
    }
}

/* data_from_host (required): copy `host` (tb_shape_nbytes bytes) to the device and set the
   payload. The library filled data->device and data->shape. */
static tb_status fake_data_from_host(void *user_data, tb_backend_data *data, const void *host) {
    size_t nbytes;
    fake_buffer *b;
    (void)user_data;
    if (tb_shape_nbytes(&data->shape, &nbytes) != TB_OK) return tb_last_status();
    b = fake_buffer_new(nbytes);
    if (b == NULL)
        return tb_set_error(TB_ERR_OUT_OF_MEMORY, "fake: no memory for %zu bytes", nbytes);
    if (nbytes > 0) memcpy(b->data, host, nbytes);
    data->payload = b;
    return TB_OK;
}

/* data_from_scalar (optional): a rank-0 value of data->shape.dtype. NULL: the library converts
   the scalar on the host and calls data_from_host. */
static tb_status fake_data_from_scalar(void *user_data, tb_backend_data *data, tb_scalar value) {
    fake_buffer *b = fake_buffer_new(tb_dtype_size(data->shape.dtype));
    (void)user_data;
    if (b == NULL) return tb_set_error(TB_ERR_OUT_OF_MEMORY, "fake: no memory for a scalar");
    switch (data->shape.dtype) {
    case TB_F32:
        *(float *)b->data = (float)tb_scalar_as_double(value);
        break;
    case TB_F64:
        *(double *)b->data = tb_scalar_as_double(value);
        break;
    case TB_I32:
        *(int32_t *)b->data = (int32_t)tb_scalar_as_int(value);
        break;
    case TB_I64:
        *(int64_t *)b->data = tb_scalar_as_int(value);
        break;
    case TB_U8:
        *(uint8_t *)b->data = (uint8_t)tb_scalar_as_int(value);
        break;
    case TB_BOOL:
        *(uint8_t *)b->data = tb_scalar_as_double(value) != 0.0;
        break;
    default:
        fake_buffer_free(b);
        return tb_set_error(TB_ERR_DTYPE, "fake: scalar of invalid dtype %d",
                            (int)data->shape.dtype);
    }
    data->payload = b;
    return TB_OK;
}

/* create_placeholder (optional): prepare a data whose value execute will produce (LTC's
   CreateDataPlaceholder). Nothing to do here: execute allocates the result buffers. */
static tb_status fake_create_placeholder(void *user_data, tb_backend_data *data) {
    (void)user_data;
    (void)data;
    return TB_OK;
}

/* get_node_data (optional): the data a node stands for. This is what the library does when
   the entry is NULL: device-data nodes carry their data. */
static tb_backend_data *fake_get_node_data(void *user_data, const tb_node *node) {
    (void)user_data;
    return tb_node_data(node);
}

/* data_to_host (required): copy the value into `host` (tb_shape_nbytes bytes). */
static tb_status fake_data_to_host(void *user_data, const tb_backend_data *data, void *host) {
    const fake_buffer *b = (const fake_buffer *)data->payload;
    (void)user_data;
    if (b->size > 0) memcpy(host, b->data, b->size);
    return TB_OK;
}

/* data_release (required): free the payload (never called for a NULL one). */
static void fake_data_release(void *user_data, tb_backend_data *data) {
    (void)user_data;
    fake_buffer_free((fake_buffer *)data->payload);
    data->payload = NULL;
}

/* create_lowering_context (required): lower the graph into something the backend owns. The
   graph's pointers are valid during this call only, so copy what compile and execute need. */
static tb_status fake_create_lowering_context(void *user_data, const tb_graph *graph,
                                              void **context) {
    fake_context *ctx = (fake_context *)calloc(1, sizeof *ctx);
    fake_program *p = (fake_program *)calloc(1, sizeof *p);
    size_t i;
    (void)user_data;
    if (ctx == NULL || p == NULL) {
        free(ctx);
        free(p);
        return tb_set_error(TB_ERR_OUT_OF_MEMORY, "fake: no memory for a program");
    }
    ctx->program = p;
    p->num_steps = graph->num_nodes;
    p->num_results = graph->num_results;
    p->num_params = graph->num_parameters;
    p->steps = (fake_step *)calloc(graph->num_nodes + 1, sizeof *p->steps);
    p->results = (size_t *)calloc(graph->num_results + 1, sizeof *p->results);
    if (p->steps == NULL || p->results == NULL) {
        fake_program_free(p);
        free(ctx);
        return tb_set_error(TB_ERR_OUT_OF_MEMORY, "fake: no memory for a program");
    }
    for (i = 0; i < graph->num_nodes; i++) {
        const tb_node *node = graph->nodes[i];
        fake_step *step = &p->steps[i];
        size_t param = fake_index_of(graph->parameters, graph->num_parameters, node);
        tb_shape_numel(tb_node_shape(node), &step->numel);
        tb_shape_nbytes(tb_node_shape(node), &step->nbytes);
        /* Parameters are the graph's leaves: device data, scalars, and nodes the library
           computed apart (the fallback), whatever their op. */
        if (param < graph->num_parameters) {
            step->kind = FAKE_PARAM;
            step->arg = param;
            continue;
        }
        switch (tb_node_op(node)) {
        case TB_OP_ADD:
            step->kind = FAKE_ADD;
            break;
        case TB_OP_MUL:
            step->kind = FAKE_MUL;
            break;
        case TB_OP_NEG:
            step->kind = FAKE_NEG;
            break;
        case TB_OP_RELU:
            step->kind = FAKE_RELU;
            break;
        default:
            fake_program_free(p);
            free(ctx);
            return tb_set_error(TB_ERR_UNSUPPORTED, "fake: cannot lower op %s",
                                tb_op_name(tb_node_op(node)));
        }
        step->a = fake_index_of(graph->nodes, i, tb_node_operand(node, 0));
        step->b = tb_node_num_operands(node) > 1
                      ? fake_index_of(graph->nodes, i, tb_node_operand(node, 1))
                      : step->a;
    }
    for (i = 0; i < graph->num_results; i++) {
        p->results[i] = fake_index_of(graph->nodes, graph->num_nodes, graph->results[i]);
    }
    *context = ctx;
    return TB_OK;
}

/* release_lowering_context (optional): called after compile, success or not. compile below
   moves the program out of the context; a program still here belongs to a failed compile. */
static void fake_release_lowering_context(void *user_data, void *context) {
    fake_context *ctx = (fake_context *)context;
    (void)user_data;
    fake_program_free(ctx->program);
    free(ctx);
}

/* get_compilation_devices (optional): the devices a computation for `device` is compiled for.
   NULL means just `device`, which is also what this does. */
static size_t fake_get_compilation_devices(void *user_data, const tb_device *device, tb_device *out,
                                           size_t cap) {
    (void)user_data;
    if (cap > 0) out[0] = *device;
    return 1;
}

static const char *const fake_step_names[] = {"param", "add", "mul", "neg", "relu"};

/* compile (required): turn the lowering context into a runnable computation. The program is
   already runnable; a real backend would generate and build device code here. */
static tb_status fake_compile(void *user_data, void *context, void **computation) {
    fake_state *s = (fake_state *)user_data;
    fake_context *ctx = (fake_context *)context;
    fake_program *p = ctx->program;
    size_t i, len = 0, cap = 64 + 80 * p->num_steps;
    p->text = (char *)malloc(cap);
    if (p->text == NULL) return tb_set_error(TB_ERR_OUT_OF_MEMORY, "fake: no memory");
    len += (size_t)snprintf(p->text + len, cap - len, "fake program, %zu steps\n", p->num_steps);
    for (i = 0; i < p->num_steps; i++) {
        const fake_step *st = &p->steps[i];
        if (st->kind == FAKE_PARAM) {
            len += (size_t)snprintf(p->text + len, cap - len, "  v%zu = param %zu\n", i, st->arg);
        } else {
            len += (size_t)snprintf(p->text + len, cap - len, "  v%zu = %s v%zu v%zu\n", i,
                                    fake_step_names[st->kind], st->a, st->b);
        }
    }
    s->compiles++;
    printf("fake: compile (%zu nodes, %zu parameters, %zu results)\n", p->num_steps, p->num_params,
           p->num_results);
    /* The computation takes the program over; the context must not free it any more. */
    *computation = p;
    ctx->program = NULL;
    return TB_OK;
}

/* execute (required): run with the parameter values and fill the result placeholders. */
static tb_status fake_execute(void *user_data, void *computation, tb_backend_data *const *arguments,
                              size_t num_arguments, tb_backend_data *const *results,
                              size_t num_results) {
    fake_state *s = (fake_state *)user_data;
    fake_program *p = (fake_program *)computation;
    void **slots = (void **)calloc(p->num_steps + 1, sizeof *slots);
    tb_status st = TB_OK;
    size_t i;
    if (slots == NULL) return tb_set_error(TB_ERR_OUT_OF_MEMORY, "fake: no memory");
    if (num_arguments != p->num_params || num_results != p->num_results) {
        free(slots);
        return tb_set_error(TB_ERR_EXECUTE, "fake: execute got %zu arguments, %zu results",
                            num_arguments, num_results);
    }
    for (i = 0; i < p->num_steps && st == TB_OK; i++) {
        const fake_step *step = &p->steps[i];
        const float *a, *b;
        float *out;
        int64_t k;
        if (step->kind == FAKE_PARAM) {
            /* parameters are read in place: their buffers outlive the call */
            slots[i] = ((fake_buffer *)arguments[step->arg]->payload)->data;
            continue;
        }
        slots[i] = malloc(step->nbytes > 0 ? step->nbytes : 1);
        if (slots[i] == NULL) {
            st = tb_set_error(TB_ERR_OUT_OF_MEMORY, "fake: no memory");
            break;
        }
        a = (const float *)slots[step->a];
        b = (const float *)slots[step->b];
        out = (float *)slots[i];
        for (k = 0; k < step->numel; k++) {
            switch (step->kind) {
            case FAKE_ADD:
                out[k] = a[k] + b[k];
                break;
            case FAKE_MUL:
                out[k] = a[k] * b[k];
                break;
            case FAKE_NEG:
                out[k] = -a[k];
                break;
            case FAKE_RELU:
                out[k] = a[k] > 0.0f ? a[k] : 0.0f;
                break;
            case FAKE_PARAM:
                break;
            }
        }
    }
    for (i = 0; i < num_results && st == TB_OK; i++) {
        const fake_step *step = &p->steps[p->results[i]];
        fake_buffer *b = fake_buffer_new(step->nbytes);
        if (b == NULL) {
            st = tb_set_error(TB_ERR_OUT_OF_MEMORY, "fake: no memory");
            break;
        }
        if (step->nbytes > 0) memcpy(b->data, slots[p->results[i]], step->nbytes);
        results[i]->payload = b;
    }
    if (st != TB_OK) {
        /* leave no half-filled results behind */
        for (i = 0; i < num_results; i++) {
            fake_buffer_free((fake_buffer *)results[i]->payload);
            results[i]->payload = NULL;
        }
    }
    for (i = 0; i < p->num_steps; i++) {
        if (p->steps[i].kind != FAKE_PARAM) free(slots[i]);
    }
    free(slots);
    if (st == TB_OK) s->executions++;
    return st;
}

/* release_computation (required): the computation left the library's cache. */
static void fake_release_computation(void *user_data, void *computation) {
    (void)user_data;
    fake_program_free((fake_program *)computation);
}

/* computation_backend_text (optional): what tb_ir_backend_text prints; owned by the
   computation. */
static const char *fake_computation_backend_text(void *user_data, const void *computation) {
    (void)user_data;
    return ((const fake_program *)computation)->text;
}

/* get_backend_devices (required): how many devices there are; fill type and ordinal of at
   most `cap` (the library writes the backend name). */
static size_t fake_get_backend_devices(void *user_data, tb_device *out, size_t cap) {
    size_t i;
    (void)user_data;
    for (i = 0; i < FAKE_NUM_DEVICES && i < cap; i++) {
        out[i].type = TB_DEVICE_ACCELERATOR;
        out[i].ordinal = (int32_t)i;
    }
    return FAKE_NUM_DEVICES;
}

/* get_backend_device (optional): one device by ordinal (the library checked the range).
   NULL: looked up in get_backend_devices. */
static tb_status fake_get_backend_device(void *user_data, int32_t ordinal, tb_device *out) {
    (void)user_data;
    out->type = TB_DEVICE_ACCELERATOR;
    out->ordinal = ordinal;
    return TB_OK;
}

/* get_device_info (optional): facts for tb_backend_device_info. */
static tb_status fake_get_device_info(void *user_data, int32_t ordinal, tb_device_info *out) {
    (void)user_data;
    snprintf(out->name, sizeof out->name, "fake accelerator %d", (int)ordinal);
    snprintf(out->vendor, sizeof out->vendor, "example");
    out->global_memory = (uint64_t)1 << 30;
    out->max_allocation = (uint64_t)1 << 28;
    out->compute_units = 4;
    out->unified_memory = true;
    out->supports_f64 = false;
    return TB_OK;
}

/* Default device type and ordinal (optional, all four): NULL lets the library keep them.
   A set hook may refuse with an error. */
static tb_device_type fake_get_default_device_type(void *user_data) {
    return ((fake_state *)user_data)->default_type;
}

static tb_status fake_set_default_device_type(void *user_data, tb_device_type type) {
    if (type != TB_DEVICE_ACCELERATOR) {
        return tb_set_error(TB_ERR_UNSUPPORTED, "fake: only ACCELERATOR devices, not %s",
                            tb_device_type_name(type));
    }
    ((fake_state *)user_data)->default_type = type;
    return TB_OK;
}

static int32_t fake_get_default_device_ordinal(void *user_data) {
    return ((fake_state *)user_data)->default_ordinal;
}

static tb_status fake_set_default_device_ordinal(void *user_data, int32_t ordinal) {
    if (ordinal < 0 || ordinal >= FAKE_NUM_DEVICES) {
        return tb_set_error(TB_ERR_NOT_FOUND, "fake: no device %d (there are %d)", (int)ordinal,
                            FAKE_NUM_DEVICES);
    }
    ((fake_state *)user_data)->default_ordinal = ordinal;
    return TB_OK;
}

/* eager_fallback_device_type (optional): where unsupported nodes run. NULL: CPU. */
static tb_device_type fake_eager_fallback_device_type(void *user_data) {
    (void)user_data;
    return TB_DEVICE_CPU;
}

/* create_metrics_report (optional): the backend's own report, snprintf-like. */
static size_t fake_create_metrics_report(void *user_data, char *buf, size_t cap) {
    const fake_state *s = (const fake_state *)user_data;
    int n = snprintf(buf, cap, "fake: %d nodes created, %d compiles, %d executions\n",
                     s->nodes_created, s->compiles, s->executions);
    return n < 0 ? 0 : (size_t)n;
}

/* data_host_pointer (optional): where the values live when the library may read and write
   them in place. This "device" keeps them in host memory, so DLPack export and the model files
   need no copy; a discrete device leaves the entry NULL. */
static void *fake_data_host_pointer(void *user_data, const tb_backend_data *data) {
    (void)user_data;
    return ((const fake_buffer *)data->payload)->data;
}

/* data_borrow_host (optional): use the caller's array in place (tb_tensor_from_host_borrowed,
   DLPack import, memory-mapped model files) and hand it back with release(context) when the
   buffer is freed. A device that cannot returns TB_ERR_UNSUPPORTED (or leaves it NULL). */
static tb_status fake_data_borrow_host(void *user_data, tb_backend_data *data, void *host,
                                       void (*release)(void *context), void *context) {
    size_t size = 0;
    fake_buffer *b;
    (void)user_data;
    if (tb_shape_nbytes(&data->shape, &size) != TB_OK) return tb_last_status();
    b = (fake_buffer *)malloc(sizeof *b);
    if (b == NULL) return tb_set_error(TB_ERR_OUT_OF_MEMORY, "fake: out of memory");
    b->data = host;
    b->size = size;
    b->release = release;
    b->release_context = context;
    b->borrowed = 1;
    data->payload = b;
    return TB_OK;
}

/* ---- registration ---- */

static tb_status fake_register(fake_state *state) {
    tb_backend_impl impl;
    memset(&impl, 0, sizeof impl);
    impl.user_data = state;
    impl.init = fake_init;
    impl.prepare_to_exit = fake_prepare_to_exit;
    impl.set_rng_seed = fake_set_rng_seed;
    impl.on_node_created = fake_on_node_created;
    impl.supports_node = fake_supports_node;
    impl.data_from_host = fake_data_from_host;
    impl.data_from_scalar = fake_data_from_scalar;
    impl.create_placeholder = fake_create_placeholder;
    impl.get_node_data = fake_get_node_data;
    impl.data_to_host = fake_data_to_host;
    impl.data_release = fake_data_release;
    impl.create_lowering_context = fake_create_lowering_context;
    impl.release_lowering_context = fake_release_lowering_context;
    impl.get_compilation_devices = fake_get_compilation_devices;
    impl.compile = fake_compile;
    impl.execute = fake_execute;
    impl.release_computation = fake_release_computation;
    impl.computation_backend_text = fake_computation_backend_text;
    impl.get_backend_devices = fake_get_backend_devices;
    impl.get_backend_device = fake_get_backend_device;
    impl.get_device_info = fake_get_device_info;
    impl.get_default_device_type = fake_get_default_device_type;
    impl.set_default_device_type = fake_set_default_device_type;
    impl.get_default_device_ordinal = fake_get_default_device_ordinal;
    impl.set_default_device_ordinal = fake_set_default_device_ordinal;
    impl.eager_fallback_device_type = fake_eager_fallback_device_type;
    impl.create_metrics_report = fake_create_metrics_report;
    impl.data_host_pointer = fake_data_host_pointer;
    impl.data_borrow_host = fake_data_borrow_host;
    return tb_backend_register("fake", &impl, "experimental");
}

static int fail(const char *what) {
    fprintf(stderr, "fake_backend: %s: %s\n", what, tb_last_error());
    return 1;
}

int main(void) {
    static fake_state state; /* lives until tb_shutdown */
    const float av[6] = {1, -2, 3, -4, 5, -6}, bv[6] = {0.5f, 0.5f, -4, 1, 1, 10};
    float out[6], ex[6];
    const char *names[8];
    size_t n, i;
    tb_device dev;
    tb_device_info info;
    tb_shape shape = tb_shape_of(TB_F32, 2, 2, 3);
    tb_tensor *a, *b, *sum, *act, *prod, *neg, *e;
    tb_tensor *roots[2];
    char *text;
    int bad = 0;

    if (fake_register(&state) != TB_OK) return fail("register");
    n = tb_backend_list(names, 8, false);
    printf("visible backends:");
    for (i = 0; i < n && i < 8; i++)
        printf(" %s", names[i]);
    n = tb_backend_list(names, 8, true);
    printf("\nall backends:");
    for (i = 0; i < n && i < 8; i++)
        printf(" %s", names[i]);
    printf("\n");

    if (tb_device_parse("fake:0", &dev) != TB_OK) return fail("device");
    if (tb_backend_device_info(&dev, &info) != TB_OK) return fail("device info");
    printf("device fake:0 is %s (%s), type %s\n", info.name, info.vendor,
           tb_device_type_name(dev.type));

    /* (relu(a + b) * a), negated; exp(a) is not supported and falls back */
    a = tb_tensor_from_host(av, &shape, &dev);
    b = tb_tensor_from_host(bv, &shape, &dev);
    sum = tb_add(a, b);
    act = tb_relu(sum);
    prod = tb_mul(act, a);
    neg = tb_neg(prod);
    e = tb_exp(a);
    if (neg == NULL || e == NULL) return fail("ops");
    roots[0] = neg;
    roots[1] = e;
    if (tb_sync(roots, 2) != TB_OK) return fail("sync");

    if (tb_tensor_to_host(neg, out, sizeof out) != TB_OK) return fail("to_host");
    printf("-(relu(a + b) * a) =");
    for (i = 0; i < 6; i++) {
        float r = av[i] + bv[i];
        float expected = -((r > 0 ? r : 0) * av[i]);
        printf(" %g", out[i]);
        if (out[i] != expected) bad = 1;
    }
    if (tb_tensor_to_host(e, ex, sizeof ex) != TB_OK) return fail("to_host");
    printf("\nexp(a) =");
    for (i = 0; i < 6; i++) {
        printf(" %g", ex[i]);
        if (fabsf(ex[i] - expf(av[i])) > 1e-5f * expf(av[i])) bad = 1;
    }
    printf("\n");

    /* a borrowed array is used in place: a change to it shows in the next computation */
    {
        float host[6] = {1, 2, 3, 4, 5, 6}, twice[6];
        tb_tensor *h = tb_tensor_from_host_borrowed(host, &shape, &dev), *t;
        host[5] = 60;
        t = tb_add(h, h);
        if (t == NULL || tb_tensor_to_host(t, twice, sizeof twice) != TB_OK)
            return fail("borrowed");
        printf("h + h over a borrowed array = %g ... %g\n", twice[0], twice[5]);
        if (twice[0] != 2 || twice[5] != 120) bad = 1;
        tb_tensor_release(t);
        tb_tensor_release(h);
    }

    text = tb_backend_metrics_report("fake");
    if (text != NULL) printf("%s", text);
    tb_free(text);

    tb_tensor_release(a);
    tb_tensor_release(b);
    tb_tensor_release(sum);
    tb_tensor_release(act);
    tb_tensor_release(prod);
    tb_tensor_release(neg);
    tb_tensor_release(e);
    tb_shutdown();
    if (bad) {
        fprintf(stderr, "fake_backend: wrong values\n");
        return 1;
    }
    printf("ok\n");
    return 0;
}
