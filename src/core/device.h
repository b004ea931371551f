/* ===========================================================================================
   Devices
   =========================================================================================== */

typedef enum tb_device_type {
    TB_DEVICE_CPU = 0,
    TB_DEVICE_GPU,
    TB_DEVICE_ACCELERATOR,
    TB_DEVICE_TYPE_COUNT
} tb_device_type;

#define TB_MAX_NAME 31 /* longest backend or op name, in bytes */

/* A device of a backend: the backend's name, the device type and an ordinal among that
   backend's devices. A zero-initialised tb_device means "the current device" wherever a device
   is taken as an argument. Text form: "opencl:1", "cpu:0". */
typedef struct tb_device {
    char backend[TB_MAX_NAME + 1];
    tb_device_type type;
    int32_t ordinal;
} tb_device;

/* Facts about a device, filled by the backend (fields it does not know stay zero/empty). */
typedef struct tb_device_info {
    tb_device device;
    char name[128];
    char vendor[128];
    char driver_version[64];
    char language_version[64]; /* e.g. "OpenCL C 1.2" */
    uint64_t global_memory;    /* bytes */
    uint64_t local_memory;     /* bytes */
    uint64_t max_allocation;   /* bytes */
    uint32_t compute_units;
    uint32_t max_work_group_size;
    bool unified_memory; /* the device shares host memory (zero-copy transfers) */
    bool supports_f64;
    char extensions[1024]; /* space-separated, cut to fit */
} tb_device_info;

/* "CPU", "GPU", "ACCELERATOR"; "invalid" otherwise. */
TBDEF const char *tb_device_type_name(tb_device_type type);
/* Parses "cpu", "gpu", "accelerator" (any case). */
TBDEF tb_status tb_device_type_parse(const char *text, tb_device_type *out);

/* Builds a device of a registered backend by ordinal, asking the backend for its type.
   Errors: unknown backend (the message lists those that exist), ordinal out of range (the
   message gives the device count). */
TBDEF tb_status tb_device_make(const char *backend, int32_t ordinal, tb_device *out);
/* Writes "opencl:1" like snprintf (see tb_shape_format). */
TBDEF size_t tb_device_format(const tb_device *device, char *buf, size_t cap);
/* Parses "backend:ordinal" or "backend" (ordinal 0) and resolves it as tb_device_make does. */
TBDEF tb_status tb_device_parse(const char *text, tb_device *out);
/* Same backend and ordinal. */
TBDEF bool tb_device_equal(const tb_device *a, const tb_device *b);

/* The current device of the calling thread: the innermost device guard's, else the default
   device (desc.device / $TB_DEVICE), else the current backend's default device. A default that
   names no usable device or backend is an error that says which setting holds it:
   "tb_current_device: TB_DEVICE='opencl:7' is not a usable device: ...",
   "tb_current_device: TB_BACKEND='nope' is not a usable backend: ...". */
TBDEF tb_status tb_current_device(tb_device *out);

/* Device guard: makes `device` current on this thread until tb_device_guard_end, which restores
   the previous one. Guards nest; end them in reverse order.
       tb_device_guard g;
       tb_device_guard_begin(&g, &dev);  ...  tb_device_guard_end(&g);                      */
typedef struct tb_device_guard {
    tb_device previous;
    bool had_previous;
    bool active;
} tb_device_guard;
TBDEF tb_status tb_device_guard_begin(tb_device_guard *guard, const tb_device *device);
TBDEF void tb_device_guard_end(tb_device_guard *guard);
