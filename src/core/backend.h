/* ===========================================================================================
   Backend interface and registry
   The C form of LTC's BackendImplInterface (torch/csrc/lazy/backend/backend_interface.h) and of
   torch._dynamo's backend registry.
   =========================================================================================== */

typedef struct tb_node tb_node;       /* an IR node (see the IR section) */
typedef struct tb_tensor tb_tensor;   /* a lazy tensor (see the tensors section) */
typedef struct tb_backend tb_backend; /* a registered backend (owned by the registry) */

/* A backend's handle to one array on one device: LTC's BackendData. The library allocates the
   struct, fills `device` and `shape`, and hands it to the backend, which sets `payload` (its own
   buffer object) in data_from_host / data_from_scalar / execute and frees it in data_release.
   A placeholder is a data whose payload is still NULL: execute fills it (LTC's Assign). */
typedef struct tb_backend_data {
    tb_device device;
    tb_shape shape;
    void *payload;    /* the backend's buffer; NULL while a placeholder has no value */
    bool is_scalar;   /* made from a scalar (tb_scalar) */
    tb_scalar scalar; /* the value when is_scalar */
    /* Owned by the library; backends leave these alone. */
    int32_t tb__refcount;
    const tb_backend *tb__backend;
    bool tb__donated; /* its buffer went to a result of an execute (tb_graph.result_donors) */
    /* its memory is shared with the host (a caller's array it borrows, or lent to a DLPack
       consumer): never a donor, whatever the tensors holding it do */
    bool tb__shared;
} tb_backend_data;

/* What a backend lowers: the nodes of one graph in post-order (operands before their users),
   the parameters (leaves whose values arrive at execution: device data and scalars, in the
   order the execute arguments come), and the results (nodes whose values execute returns, in
   the order of the result placeholders). Every pointer is valid during the call only, except
   that nodes are retained by the library for as long as the computation lives. */
typedef struct tb_graph {
    const tb_node *const *nodes;
    size_t num_nodes;
    const tb_node *const *parameters;
    size_t num_parameters;
    const tb_node *const *results;
    size_t num_results;
    uint64_t hash; /* structural hash of the graph: equal hashes, same computation */
    tb_device device;
    /* Buffer donation (XLA's input/output aliasing), or NULL: result_donors[i] >= 0 names a
       parameter whose value nothing reads after this graph (the value the tensor of result i
       held before tb_assign), of result i's shape. A backend may compute result i into that
       parameter's buffer: at execute it moves the argument's payload to results[i] and sets
       the argument's payload to NULL, once no kernel still to run reads the old value at any
       other element. It may as well ignore the offer. An argument whose payload is NULL after
       execute (success or not) was consumed: its old value is gone. Part of the hash. */
    const int32_t *result_donors;
} tb_graph;

/* The backend vtable. `user_data` is handed to every entry. Entries marked (optional) may be NULL
   and then behave as described. The registry copies the struct. */
typedef struct tb_backend_impl {
    void *user_data;

    /* (optional) Called once when the backend is registered; an error rejects the
       registration (the backend is not registered). */
    tb_status (*init)(void *user_data);
    /* (optional) LTC PrepareToExit: called once by tb_shutdown, after the library released
       every computation and data it held (the cache, the IR) and before a plugin is unloaded.
       Release queues, contexts, caches. */
    void (*prepare_to_exit)(void *user_data);
    /* (optional) LTC SetRngSeed: called by tb_manual_seed. Backends that generate random numbers
       themselves must produce the library's Philox stream (see tb_rand). */
    void (*set_rng_seed)(void *user_data, uint64_t seed);

    /* IR builder hooks (LTC GetIrBuilder). (optional) on_node_created: called for every node
       recorded on a device of this backend; an error rejects the op (the op returns NULL).
       (optional) supports_node: false makes the executor run that node on the reference
       backend (eager fallback, counted in the metrics); NULL: every node is supported. A
       COLLECTIVE node is never asked about: the executor runs it on the host itself. */
    tb_status (*on_node_created)(void *user_data, const tb_node *node);
    bool (*supports_node)(void *user_data, const tb_node *node);

    /* LTC MakeComputationDataFromTensor: `data` has device and shape set; copy the contiguous
       host array `host` (tb_shape_nbytes bytes) to the device and set data->payload. Required. */
    tb_status (*data_from_host)(void *user_data, tb_backend_data *data, const void *host);
    /* (optional) LTC MakeComputationDataFromScalar: `data` is rank 0 of the scalar's dtype.
       NULL: the scalar is converted on the host and handed to data_from_host. */
    tb_status (*data_from_scalar)(void *user_data, tb_backend_data *data, tb_scalar value);
    /* (optional) LTC CreateDataPlaceholder: prepare a data without a value (payload may stay
       NULL; execute fills it). NULL: nothing to prepare. */
    tb_status (*create_placeholder)(void *user_data, tb_backend_data *data);
    /* (optional) LTC GetComputationDataFromNode: the data a node stands for, or NULL.
       NULL: the library answers for device-data nodes (tb_node_data). */
    tb_backend_data *(*get_node_data)(void *user_data, const tb_node *node);
    /* LTC MakeTensorFromComputationData: copy the value to the contiguous host array `host`
       (tb_shape_nbytes(&data->shape) bytes). Required. */
    tb_status (*data_to_host)(void *user_data, const tb_backend_data *data, void *host);
    /* Free data->payload (never called for a NULL payload). Required. */
    void (*data_release)(void *user_data, tb_backend_data *data);

    /* LTC CreateLoweringContext + Lower + Build: lower every node of `graph` into a
       backend-owned context. Required. */
    tb_status (*create_lowering_context)(void *user_data, const tb_graph *graph, void **context);
    /* (optional) frees a lowering context; called after compile, success or not. */
    void (*release_lowering_context)(void *user_data, void *context);
    /* (optional) LTC GetCompilationDevices: the devices a computation for `device` is compiled
       for; returns how many exist, fills at most `cap`. NULL: just `device`. */
    size_t (*get_compilation_devices)(void *user_data, const tb_device *device, tb_device *out,
                                      size_t cap);
    /* LTC Compile: turn a lowering context into a runnable computation. Required. */
    tb_status (*compile)(void *user_data, void *context, void **computation);
    /* LTC ExecuteComputation: run with the parameter values `arguments` (graph parameter order)
       and fill the payloads of the `results` placeholders (graph result order; device and shape
       set). Required. */
    tb_status (*execute)(void *user_data, void *computation, tb_backend_data *const *arguments,
                         size_t num_arguments, tb_backend_data *const *results, size_t num_results);
    /* Frees a computation (when it leaves the computation cache). Required. */
    void (*release_computation)(void *user_data, void *computation);
    /* (optional) LTC GetComputationBackendText: the computation as the backend sees it (the
       OpenCL C of its program, ...); owned by the computation. NULL without an error: no text;
       NULL with an error set (host->set_error, tb_set_error): the text could not be made, and
       tb_ir_backend_text fails with that error. */
    const char *(*computation_backend_text)(void *user_data, const void *computation);

    /* LTC GetBackendDevices: how many devices exist; fills at most `cap` of `out` with their
       type and ordinal (the library fills the backend name). `out` is NULL only with `cap`
       0. Required; may return 0. Returning 0 with an error set (memory ran out while the
       backend loaded its driver) is no answer: the call that asked fails with that error. */
    size_t (*get_backend_devices)(void *user_data, tb_device *out, size_t cap);
    /* (optional) LTC GetBackendDevice(ordinal). NULL: looked up in get_backend_devices. */
    tb_status (*get_backend_device)(void *user_data, int32_t ordinal, tb_device *out);
    /* (optional) device facts for tb_backend_device_info. NULL: only the device is filled. */
    tb_status (*get_device_info)(void *user_data, int32_t ordinal, tb_device_info *out);
    /* (optional) LTC Get/SetDefaultDeviceType and Get/SetDefaultDeviceOrdinal. NULL: the
       library keeps the default itself (type of device 0, ordinal 0). A set hook may refuse. */
    tb_device_type (*get_default_device_type)(void *user_data);
    tb_status (*set_default_device_type)(void *user_data, tb_device_type type);
    int32_t (*get_default_device_ordinal)(void *user_data);
    tb_status (*set_default_device_ordinal)(void *user_data, int32_t ordinal);
    /* (optional) LTC EagerFallbackDeviceType. NULL: TB_DEVICE_CPU. */
    tb_device_type (*eager_fallback_device_type)(void *user_data);
    /* (optional) LTC CreateMetricsReport: snprintf-like, returns the full length. NULL: "".
       Returning 0 with an error set (memory ran out) fails tb_backend_metrics_report. */
    size_t (*create_metrics_report)(void *user_data, char *buf, size_t cap);
    /* (optional) Which kernel of `computation` computes node `node_index` of the post-order
       (tb_graph.nodes) of the graph it was compiled from: the kernel's index, and its name in
       *kernel_name (owned by the computation; may be NULL). -1 for parameters and for nodes no
       kernel computes; a folded view counts as part of the kernel that reads it when the
       backend knows which one, else -1. tb_ir_dot draws each kernel as a cluster.
       NULL: no clusters. */
    int32_t (*get_node_kernel)(void *user_data, const void *computation, size_t node_index,
                               const char **kernel_name);
    /* (optional) Host memory: the address of the data's values when the backend keeps them in
       host memory that the library may read in place (a CPU backend; a device that shares the
       host's memory), else NULL. DLPack export and the model files then skip a copy. NULL
       entry: always a copy. The memory may be a caller's array or a read-only file mapping
       (data_borrow_host): a backend never writes into a borrowed payload, and so never takes
       one as a donated buffer (tb_graph.result_donors). */
    void *(*data_host_pointer)(void *user_data, const tb_backend_data *data);
    /* (optional) Zero-copy import: makes `data` (device and shape set, no payload yet) use the
       caller's `host` array in place, which stays valid until `release(context)` is called
       (once, when the backend no longer needs it; `release` may be NULL). Returns
       TB_ERR_UNSUPPORTED, with nothing called, when it cannot (then the library copies, as it
       does when the entry is NULL); on any failure it leaves data->payload NULL. */
    tb_status (*data_borrow_host)(void *user_data, tb_backend_data *data, void *host,
                                  void (*release)(void *context), void *context);
    /* (optional) Host access for one host step (a collective's input and result, an eager
       fallback's operands): the address of the data's values in host memory, valid until
       data_unmap_host, when the backend can give one without a copy (a CPU backend; a device
       that shares the host's memory, through a mapping). `write` false: the library only
       reads the values. `write` true: `data` has no payload yet; the backend allocates it and
       the library writes every value before data_unmap_host, and before any other use of the
       data. NULL without an error (and, for `write`, data->payload left NULL): not possible
       here, the library copies (data_to_host, data_from_host). NULL entry: always a copy. */
    void *(*data_map_host)(void *user_data, tb_backend_data *data, bool write);
    /* (optional) Ends a data_map_host (`host` is what it returned). NULL: nothing to do. */
    tb_status (*data_unmap_host)(void *user_data, tb_backend_data *data, void *host);
} tb_backend_impl;

/* Registers a backend under `name` (1..TB_MAX_NAME bytes, [A-Za-z_][A-Za-z0-9_]*), with
   comma-separated `tags` (may be NULL or ""; each tag an identifier). The impl is copied; its
   init entry runs first and its failure rejects the registration. Errors: NULL or bad name,
   missing required entries, TB_ERR_DUPLICATE "duplicate name: X", and the cause when the
   built-in backends (registered on first use) could not be registered first. Thread-safe. */
TBDEF tb_status tb_backend_register(const char *name, const tb_backend_impl *impl,
                                    const char *tags);
/* Looks a backend up. On a miss it searches $TB_BACKEND_PATH for libtb_backend_<name>.so and
   loads it as a plugin. Still missing: NULL and TB_ERR_NOT_FOUND
   "unknown backend 'x'; available: cpu, opencl". A built-in backend whose registration failed
   (memory ran out) gives that cause instead, and the next call registers it again; a plugin
   that is found but does not load gives the error of tb_backend_load_plugin. The handle lives
   until tb_shutdown. Thread-safe. */
TBDEF tb_backend *tb_backend_lookup(const char *name);
/* True if a backend of that name is registered or loadable as a plugin. Does not set an error
   when the answer is false. Thread-safe. */
TBDEF bool tb_has_backend(const char *name);
/* Sorted names of the registered backends, hiding those tagged "debug" or "experimental" unless
   `include_hidden`. Returns how many there are and fills at most `cap` of `names` (pointers
   valid until tb_shutdown). `names` NULL: just the count (`cap` is ignored). Thread-safe. */
TBDEF size_t tb_backend_list(const char **names, size_t cap, bool include_hidden);
TBDEF const char *tb_backend_name(const tb_backend *backend);
/* The tags as registered ("" when none). */
TBDEF const char *tb_backend_tags(const tb_backend *backend);
TBDEF bool tb_backend_has_tag(const tb_backend *backend, const char *tag);
/* The registered vtable (a copy owned by the registry). */
TBDEF const tb_backend_impl *tb_backend_get_impl(const tb_backend *backend);

/* The current backend: new tensors without an explicit device go there. Default: desc.backend,
   else $TB_BACKEND, else "cpu", looked up on first use (a plugin is loaded then).
   tb_set_backend: an unknown name is TB_ERR_NOT_FOUND and changes nothing.
   tb_get_backend returns the current backend's name (valid until tb_shutdown), or NULL when
   the default names no usable backend: the error then says which setting holds the bad name,
   e.g. "tb_get_backend: TB_BACKEND='nope' is not a usable backend: unknown backend 'nope';
   available: cpu, opencl". Every use of the default fails the same way (tb_current_device,
   and with it every new tensor without a device) until tb_set_backend picks one; nothing falls
   back to "cpu". Thread-safe (process-wide). */
TBDEF tb_status tb_set_backend(const char *name);
TBDEF const char *tb_get_backend(void);

/* The devices of a backend: fills at most `cap`, *count (may be NULL) gets how many exist.
   `out` NULL: just the count (`cap` is ignored). */
TBDEF tb_status tb_backend_devices(const char *backend, tb_device *out, size_t cap, size_t *count);
/* Facts about one device. */
TBDEF tb_status tb_backend_device_info(const tb_device *device, tb_device_info *out);
/* LTC's default device type and ordinal, per backend. */
TBDEF tb_status tb_backend_get_default_device_type(const char *backend, tb_device_type *out);
TBDEF tb_status tb_backend_set_default_device_type(const char *backend, tb_device_type type);
TBDEF tb_status tb_backend_get_default_device_ordinal(const char *backend, int32_t *out);
TBDEF tb_status tb_backend_set_default_device_ordinal(const char *backend, int32_t ordinal);
/* The device of the backend's default type and ordinal. */
TBDEF tb_status tb_backend_default_device(const char *backend, tb_device *out);
TBDEF tb_status tb_backend_eager_fallback_device_type(const char *backend, tb_device_type *out);
/* The backend's own metrics report; free it with tb_free. NULL on error. */
TBDEF char *tb_backend_metrics_report(const char *backend);

/* ---- plugins ----
   A plugin is a shared object libtb_backend_<name>.so that exports
       tb_status tb_backend_plugin_entry(const tb_plugin_host *host, tb_plugin_desc *out);
   which fills `out` (api_version = TB_API_VERSION, name = <name>, tags, impl). The library
   checks the API version and the name, then registers the impl (init runs). Any failure leaves
   the registry as it was and unloads the object.
   Errors: a plugin reports a reason with host->set_error, or with tb_set_error when it builds
   its own copy of the library (TB_STATIC + TB_IMPLEMENTATION, with gcc or clang): that copy
   exports tb_plugin_attach_host (TB_PLUGIN_ATTACH_NAME), which the host calls with its
   services before the entry, and from then on the copy's tb_set_error also sets the host's
   error. Only tb_set_error is passed on: another function of the copy that fails keeps its
   error in the copy (return tb_set_error(st, "%s", tb_last_error()) passes it on). */
#define TB_PLUGIN_ENTRY_NAME  "tb_backend_plugin_entry"
#define TB_PLUGIN_ATTACH_NAME "tb_plugin_attach_host"

/* The host's services for a plugin. The struct stays valid while the plugin is loaded, so a
   plugin may keep the pointer it is given. alloc and free are the host's allocator hooks. */
typedef struct tb_plugin_host {
    uint32_t api_version;
    tb_status (*set_error)(tb_status status, const char *message);
    void (*log)(tb_log_level level, const char *message);
    void *(*alloc)(size_t size);
    void (*free)(void *ptr);
} tb_plugin_host;

typedef struct tb_plugin_desc {
    uint32_t api_version;
    const char *name;
    const char *tags;
    tb_backend_impl impl;
} tb_plugin_desc;

typedef tb_status (*tb_plugin_entry_fn)(const tb_plugin_host *host, tb_plugin_desc *out);
typedef void (*tb_plugin_attach_fn)(const tb_plugin_host *host);

/* The backend names that $TB_BACKEND_PATH offers as plugins: every regular file
   libtb_backend_<name>.so in its folders whose <name> is a valid backend name, sorted, each name
   once, registered or not. Nothing is loaded (tb_backend_lookup loads one, and says why one
   does not load). Returns how many there are and copies at most `cap` of them into `names`;
   `names` NULL: just the count (`cap` is ignored). Folders that cannot be read are skipped;
   0 without TB_BACKEND_PATH and in builds without plugins. Thread-safe. */
TBDEF size_t tb_backend_list_plugins(char (*names)[TB_MAX_NAME + 1], size_t cap);

/* Loads a plugin from an explicit path (the name comes from the plugin's desc).
   Errors: TB_ERR_IO (cannot open), TB_ERR_PLUGIN (no entry symbol, wrong API version, entry or
   init failed, name mismatch), TB_ERR_DUPLICATE, TB_ERR_OUT_OF_MEMORY (memory ran out while it
   was registered, or the entry or init said so; the message names the plugin, and a later
   call may load it). Thread-safe. */
TBDEF tb_status tb_backend_load_plugin(const char *path);
