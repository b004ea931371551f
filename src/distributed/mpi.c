/* ===========================================================================================
   The `mpi` process group: the MPI library opened at run time (no -lmpi, no mpi.h), Open MPI's
   libmpi.so.40, MPICH's libmpich.so.12 or an MPI-5 standard ABI library. The three ABIs differ
   in what a handle is: Open MPI's MPI_COMM_WORLD, MPI_FLOAT, MPI_SUM are the addresses of
   global objects (found with dlsym), MPICH's are int constants, the standard ABI's are small
   integers in pointer-typed handles. Each is spelled out below.
   =========================================================================================== */
#include "../impl_begin.h"
#include "distributed_internal.h"

#if defined(TB__HAVE_MPI)

/* How the library spells handles. */
typedef enum tb__mpi_abi {
    TB__MPI_ABI_OPEN_MPI = 1, /* pointers: addresses of ompi_mpi_* globals */
    TB__MPI_ABI_MPICH,        /* int constants (MPICH, and Intel MPI, MVAPICH on its ABI) */
    TB__MPI_ABI_STANDARD      /* MPI-5: pointer-typed handles holding small integers */
} tb__mpi_abi;

/* The entry points that take no handle. */
typedef struct tb__mpi_common_api {
    int (*Initialized)(int *flag);
    int (*Finalized)(int *flag);
    int (*Init)(int *argc, char ***argv);
    int (*Finalize)(void);
    int (*Error_string)(int code, char *text, int *length);
} tb__mpi_common_api;
static const char *const tb__mpi_common_symbols[] = {"MPI_Initialized", "MPI_Finalized", "MPI_Init",
                                                     "MPI_Finalize", "MPI_Error_string"};

/* The entry points that take handles: once with pointer handles (Open MPI, standard ABI) and once
   with int handles (MPICH); the symbols are the same. The collectives are the nonblocking ones,
   completed by polling MPI_Test against a deadline (TB_COLLECTIVE_TIMEOUT), so that a rank that
   died or stopped calling gives the others an error instead of a wait without end. A request is
   a pointer in the first two ABIs and an int in MPICH's; the status is ignored (a buffer larger
   than any ABI's MPI_Status). */
typedef struct tb__mpi_pointer_api {
    int (*Comm_rank)(void *comm, int *rank);
    int (*Comm_size)(void *comm, int *size);
    int (*Ibarrier)(void *comm, void **request);
    int (*Iallreduce)(const void *send, void *recv, int count, void *type, void *op, void *comm,
                      void **request);
    int (*Iallgather)(const void *send, int send_count, void *send_type, void *recv, int recv_count,
                      void *recv_type, void *comm, void **request);
    int (*Ireduce_scatter_block)(const void *send, void *recv, int count, void *type, void *op,
                                 void *comm, void **request);
    int (*Ibcast)(void *buf, int count, void *type, int root, void *comm, void **request);
    int (*Test)(void **request, int *flag, void *status);
} tb__mpi_pointer_api;
typedef struct tb__mpi_int_api {
    int (*Comm_rank)(int comm, int *rank);
    int (*Comm_size)(int comm, int *size);
    int (*Ibarrier)(int comm, int *request);
    int (*Iallreduce)(const void *send, void *recv, int count, int type, int op, int comm,
                      int *request);
    int (*Iallgather)(const void *send, int send_count, int send_type, void *recv, int recv_count,
                      int recv_type, int comm, int *request);
    int (*Ireduce_scatter_block)(const void *send, void *recv, int count, int type, int op,
                                 int comm, int *request);
    int (*Ibcast)(void *buf, int count, int type, int root, int comm, int *request);
    int (*Test)(int *request, int *flag, void *status);
} tb__mpi_int_api;
#define TB__MPI_HANDLE_SYMBOLS 8
static const char *const tb__mpi_handle_symbols[TB__MPI_HANDLE_SYMBOLS] = {
    "MPI_Comm_rank",  "MPI_Comm_size",  "MPI_Ibarrier",
    "MPI_Iallreduce", "MPI_Iallgather", "MPI_Ireduce_scatter_block",
    "MPI_Ibcast",     "MPI_Test"};

/* A request in flight, of either ABI. */
typedef struct tb__mpi_request {
    void *p;
    int i;
} tb__mpi_request;

/* Handle indices: the datatypes of f32 f64 i32 i64 u8, then MPI_BYTE; the ops SUM MAX MIN PROD. */
#define TB__MPI_NUM_TYPES 6
#define TB__MPI_TYPE_BYTE 5
#define TB__MPI_NUM_OPS   4

static const char *const tb__ompi_type_symbols[TB__MPI_NUM_TYPES] = {
    "ompi_mpi_float",   "ompi_mpi_double",  "ompi_mpi_int32_t",
    "ompi_mpi_int64_t", "ompi_mpi_uint8_t", "ompi_mpi_byte"};
static const char *const tb__ompi_op_symbols[TB__MPI_NUM_OPS] = {
    "ompi_mpi_op_sum", "ompi_mpi_op_max", "ompi_mpi_op_min", "ompi_mpi_op_prod"};
/* MPICH's mpi.h: MPI_COMM_WORLD, MPI_FLOAT, MPI_DOUBLE, MPI_INT32_T, MPI_INT64_T, MPI_UINT8_T,
   MPI_BYTE, MPI_SUM, MPI_MAX, MPI_MIN, MPI_PROD. */
static const int tb__mpich_world = 0x44000000;
static const int tb__mpich_types[TB__MPI_NUM_TYPES] = {0x4c00040a, 0x4c00080b, 0x4c000439,
                                                       0x4c00083a, 0x4c00013b, 0x4c00010d};
static const int tb__mpich_ops[TB__MPI_NUM_OPS] = {0x58000003, 0x58000001, 0x58000002, 0x58000004};
/* The MPI-5 standard ABI's mpi.h, same order. */
static const uintptr_t tb__mpiabi_world = 0x101;
static const uintptr_t tb__mpiabi_types[TB__MPI_NUM_TYPES] = {0x210, 0x214, 0x250,
                                                              0x258, 0x241, 0x247};
static const uintptr_t tb__mpiabi_ops[TB__MPI_NUM_OPS] = {0x21, 0x23, 0x22, 0x24};

typedef struct tb__mpi_state {
    void *lib;
    tb__mpi_abi abi;
    char path[256];
    bool initialized_here; /* MPI_Init was ours, so MPI_Finalize is ours too */
    double timeout_s;      /* TB_COLLECTIVE_TIMEOUT: how long a collective may wait; 0: no end */
    /* a collective that did not complete in time: the group is unusable from then on (MPI
       cannot cancel a collective, and the ranks no longer agree on what comes next) */
    char broken[384];
    tb__mpi_common_api common;
    tb__mpi_pointer_api p; /* Open MPI and the standard ABI */
    tb__mpi_int_api i;     /* MPICH */
    void *p_world, *p_types[TB__MPI_NUM_TYPES], *p_ops[TB__MPI_NUM_OPS];
    int i_world, i_types[TB__MPI_NUM_TYPES], i_ops[TB__MPI_NUM_OPS];
} tb__mpi_state;

static tb__mpi_state tb__mpi;

/* Resolves `count` symbols into consecutive function pointers at `out`; false names the first
   missing one in `reason`. */
static bool tb__mpi_resolve(void *lib, const char *const *names, size_t count, void *out,
                            char *reason, size_t cap) {
    size_t i;
    for (i = 0; i < count; i++) {
        void *sym = dlsym(lib, names[i]);
        if (sym == NULL) {
            snprintf(reason, cap, "%s does not export %s", tb__mpi.path, names[i]);
            return false;
        }
        memcpy((char *)out + i * sizeof(void *), &sym, sizeof sym);
    }
    return true;
}

/* Where Open MPI's handle objects live. A program linked with libmpi may hold copies of them
   (copy relocations of an executable), which libmpi itself then uses: the global scope finds
   those first. It is used only when it resolves to the same library (same MPI_Init). */
static void *tb__ompi_scope(void) {
    void *global = dlopen(NULL, RTLD_NOW);
    void *ours = dlsym(tb__mpi.lib, "MPI_Init");
    if (global != NULL && ours != NULL && dlsym(global, "MPI_Init") == ours &&
        dlsym(global, "ompi_mpi_comm_world") != NULL) {
        return global;
    }
    return tb__mpi.lib;
}

/* The handles of the library's ABI; false when an Open MPI global is missing. */
static bool tb__mpi_resolve_handles(char *reason, size_t cap) {
    size_t i;
    void *scope;
    if (tb__mpi.abi == TB__MPI_ABI_MPICH) {
        tb__mpi.i_world = tb__mpich_world;
        memcpy(tb__mpi.i_types, tb__mpich_types, sizeof tb__mpi.i_types);
        memcpy(tb__mpi.i_ops, tb__mpich_ops, sizeof tb__mpi.i_ops);
        return true;
    }
    if (tb__mpi.abi == TB__MPI_ABI_STANDARD) {
        tb__mpi.p_world = (void *)tb__mpiabi_world;
        for (i = 0; i < TB__MPI_NUM_TYPES; i++)
            tb__mpi.p_types[i] = (void *)tb__mpiabi_types[i];
        for (i = 0; i < TB__MPI_NUM_OPS; i++)
            tb__mpi.p_ops[i] = (void *)tb__mpiabi_ops[i];
        return true;
    }
    scope = tb__ompi_scope();
    if (!tb__mpi_resolve(scope, tb__ompi_type_symbols, TB__MPI_NUM_TYPES, tb__mpi.p_types, reason,
                         cap) ||
        !tb__mpi_resolve(scope, tb__ompi_op_symbols, TB__MPI_NUM_OPS, tb__mpi.p_ops, reason, cap)) {
        return false;
    }
    tb__mpi.p_world = dlsym(scope, "ompi_mpi_comm_world");
    return tb__mpi.p_world != NULL;
}

/* Opens `path` and fills tb__mpi; false with the reason, and nothing kept, on failure. */
static bool tb__mpi_open(const char *path, char *reason, size_t cap) {
    void *lib;
    bool ok;
    /* RTLD_GLOBAL: Open MPI's components are shared objects that it opens itself and that
       resolve libmpi's symbols globally. */
    lib = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (lib == NULL) {
        const char *why = dlerror();
        snprintf(reason, cap, "%s", why != NULL ? why : path);
        return false;
    }
    memset(&tb__mpi, 0, sizeof tb__mpi);
    tb__mpi.lib = lib;
    snprintf(tb__mpi.path, sizeof tb__mpi.path, "%s", path);
    if (dlsym(lib, "ompi_mpi_comm_world") != NULL) {
        tb__mpi.abi = TB__MPI_ABI_OPEN_MPI;
    } else if (dlsym(lib, "MPI_Abi_get_version") != NULL) {
        tb__mpi.abi = TB__MPI_ABI_STANDARD;
    } else {
        tb__mpi.abi = TB__MPI_ABI_MPICH;
    }
    ok = sizeof(tb__mpi_common_api) == 5 * sizeof(void *) &&
         sizeof(tb__mpi_pointer_api) == TB__MPI_HANDLE_SYMBOLS * sizeof(void *) &&
         sizeof(tb__mpi_int_api) == TB__MPI_HANDLE_SYMBOLS * sizeof(void *) &&
         tb__mpi_resolve(lib, tb__mpi_common_symbols, 5, &tb__mpi.common, reason, cap) &&
         tb__mpi_resolve(lib, tb__mpi_handle_symbols, TB__MPI_HANDLE_SYMBOLS,
                         tb__mpi.abi == TB__MPI_ABI_MPICH ? (void *)&tb__mpi.i : (void *)&tb__mpi.p,
                         reason, cap) &&
         tb__mpi_resolve_handles(reason, cap);
    if (!ok) {
        if (reason[0] == '\0') snprintf(reason, cap, "%s: not a usable MPI library", path);
        dlclose(lib);
        memset(&tb__mpi, 0, sizeof tb__mpi);
    }
    return ok;
}

/* Opens the MPI library once: $TB_MPI_LIBRARY alone when set, else the libraries of Open MPI,
   MPICH and the standard ABI, the one of the launcher that started this process first. */
static tb_status tb__mpi_load(void) {
    const char *names[4];
    size_t n = 0, i, used = 0;
    char tried[1024], reason[512];
    const char *forced = tb__getenv("TB_MPI_LIBRARY");
    if (tb__mpi.lib != NULL) return TB_OK;
    if (forced != NULL) {
        names[n++] = forced;
    } else if (tb__getenv("PMI_RANK") != NULL && tb__getenv("OMPI_COMM_WORLD_RANK") == NULL) {
        names[n++] = "libmpich.so.12";
        names[n++] = "libmpi.so.40";
        names[n++] = "libmpi_abi.so.0";
    } else {
        names[n++] = "libmpi.so.40";
        names[n++] = "libmpich.so.12";
        names[n++] = "libmpi_abi.so.0";
    }
    tried[0] = '\0';
    for (i = 0; i < n; i++) {
        int w;
        reason[0] = '\0';
        if (tb__mpi_open(names[i], reason, sizeof reason)) return TB_OK;
        w = snprintf(tried + used, sizeof tried - used, "%s%s", used > 0 ? "; " : "", reason);
        if (w > 0) used = used + (size_t)w < sizeof tried ? used + (size_t)w : sizeof tried - 1;
    }
    return tb__error(TB_ERR_UNAVAILABLE,
                     "mpi: no usable MPI library (%s); install Open MPI (libopenmpi3) or MPICH, "
                     "or name the library in TB_MPI_LIBRARY",
                     tried);
}

/* An MPI return code as an error of the library. */
static tb_status tb__mpi_check(int code, const char *what) {
    char text[512];
    int len = 0;
    if (code == 0) return TB_OK;
    text[0] = '\0';
    if (tb__mpi.common.Error_string == NULL || tb__mpi.common.Error_string(code, text, &len) != 0 ||
        len <= 0) {
        snprintf(text, sizeof text, "error %d", code);
    }
    text[sizeof text - 1] = '\0';
    return tb__error(TB_ERR_EXECUTE, "mpi: %s failed: %s", what, text);
}

/* TB_COLLECTIVE_TIMEOUT as seconds: unset or empty gives 300; 0 waits without end. */
static tb_status tb__mpi_read_timeout(double *out) {
    const char *v = tb__getenv("TB_COLLECTIVE_TIMEOUT");
    char *end = NULL;
    double t;
    *out = 300.0;
    if (v == NULL || v[0] == '\0') return TB_OK;
    t = strtod(v, &end);
    if (end == v || *end != '\0' || !(t >= 0.0) || t > 1e9) {
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "mpi: TB_COLLECTIVE_TIMEOUT='%.64s' is not a number of seconds (>= 0; "
                         "0 waits without end)",
                         v);
    }
    *out = t;
    return TB_OK;
}

/* Whether the group can still be used; the error when an earlier collective timed out. */
static tb_status tb__mpi_usable(const char *what) {
    if (tb__mpi.broken[0] == '\0') return TB_OK;
    return tb__error(TB_ERR_STATE, "mpi: %s refused: the process group is unusable since %s", what,
                     tb__mpi.broken);
}

/* Completes a started collective (`code` is what starting it returned) by polling MPI_Test
   until it is done or TB_COLLECTIVE_TIMEOUT seconds have passed. The loop yields the processor
   every few tests, as MPI's own blocking calls do on a busy node: MPI makes progress only
   inside its calls, so the loop never sleeps. */
static tb_status tb__mpi_wait(int code, tb__mpi_request *req, const char *what) {
    int64_t status[32]; /* MPI_Status of any ABI */
    uint64_t start = tb__now_ns(), limit = (uint64_t)(tb__mpi.timeout_s * 1e9);
    uint32_t polls = 0;
    tb_status st = tb__mpi_check(code, what);
    if (st != TB_OK) return st;
    for (;;) {
        int flag = 0;
        code = tb__mpi.abi == TB__MPI_ABI_MPICH ? tb__mpi.i.Test(&req->i, &flag, status)
                                                : tb__mpi.p.Test(&req->p, &flag, status);
        st = tb__mpi_check(code, what);
        if (st != TB_OK || flag) return st;
        if (++polls % 64 == 0) {
            uint64_t waited = tb__now_ns() - start;
            if (limit > 0 && waited >= limit) break;
            tb__yield();
        }
    }
    snprintf(tb__mpi.broken, sizeof tb__mpi.broken,
             "%s did not complete within TB_COLLECTIVE_TIMEOUT=%g s on this rank", what,
             tb__mpi.timeout_s);
    return tb__error(TB_ERR_EXECUTE,
                     "mpi: %s did not complete within %g s (TB_COLLECTIVE_TIMEOUT): another rank "
                     "died, hangs, or stopped calling collectives; the process group is unusable "
                     "from now on (end the process: MPI cannot cancel a collective)",
                     what, tb__mpi.timeout_s);
}

static int tb__mpi_type_index(tb_dtype dtype) {
    switch (dtype) {
    case TB_F32:
        return 0;
    case TB_F64:
        return 1;
    case TB_I32:
        return 2;
    case TB_I64:
        return 3;
    case TB_U8:
        return 4;
    default:
        return -1;
    }
}

static int tb__mpi_op_index(tb_reduce_op op) {
    switch (op) {
    case TB_REDUCE_SUM:
        return 0;
    case TB_REDUCE_MAX:
        return 1;
    case TB_REDUCE_MIN:
        return 2;
    case TB_REDUCE_PRODUCT:
        return 3;
    default:
        return -1;
    }
}

static tb_status tb__mpi_init(void *user_data, int32_t *rank, int32_t *size) {
    int flag = 0, r = 0, s = 0;
    tb_status st;
    (void)user_data;
    st = tb__mpi_load();
    if (st == TB_OK) st = tb__mpi_read_timeout(&tb__mpi.timeout_s);
    if (st != TB_OK) return st;
    tb__mpi.broken[0] = '\0';
    if (tb__mpi.common.Finalized(&flag) == 0 && flag) {
        return tb__error(TB_ERR_STATE, "mpi: MPI was finalized in this process (by tb_shutdown "
                                       "or the program), and MPI cannot start twice");
    }
    if (tb__mpi.common.Initialized(&flag) != 0) flag = 0;
    if (!flag) {
        st = tb__mpi_check(tb__mpi.common.Init(NULL, NULL), "MPI_Init");
        if (st != TB_OK) return st;
        tb__mpi.initialized_here = true;
    }
    if (tb__mpi.abi == TB__MPI_ABI_MPICH) {
        st = tb__mpi_check(tb__mpi.i.Comm_rank(tb__mpi.i_world, &r), "MPI_Comm_rank");
        if (st == TB_OK)
            st = tb__mpi_check(tb__mpi.i.Comm_size(tb__mpi.i_world, &s), "MPI_Comm_size");
    } else {
        st = tb__mpi_check(tb__mpi.p.Comm_rank(tb__mpi.p_world, &r), "MPI_Comm_rank");
        if (st == TB_OK)
            st = tb__mpi_check(tb__mpi.p.Comm_size(tb__mpi.p_world, &s), "MPI_Comm_size");
    }
    if (st != TB_OK) return st;
    *rank = (int32_t)r;
    *size = (int32_t)s;
    return TB_OK;
}

static tb_status tb__mpi_all_reduce(void *user_data, const void *send, void *recv, size_t count,
                                    tb_dtype dtype, tb_reduce_op op) {
    int t = tb__mpi_type_index(dtype), o = tb__mpi_op_index(op);
    size_t esize = tb_dtype_size(dtype), done = 0;
    tb_status st = tb__mpi_usable("MPI_Iallreduce");
    (void)user_data;
    if (st != TB_OK) return st;
    if (t < 0 || o < 0) {
        return tb__error(TB_ERR_INTERNAL, "mpi: all_reduce of %s with op %d", tb_dtype_name(dtype),
                         (int)op);
    }
    /* MPI counts are int: larger arrays go in pieces. */
    while (done < count) {
        size_t n = count - done < (size_t)INT_MAX ? count - done : (size_t)INT_MAX;
        const char *s = (const char *)send + done * esize;
        char *r = (char *)recv + done * esize;
        tb__mpi_request req = {NULL, 0};
        int code = tb__mpi.abi == TB__MPI_ABI_MPICH
                       ? tb__mpi.i.Iallreduce(s, r, (int)n, tb__mpi.i_types[t], tb__mpi.i_ops[o],
                                              tb__mpi.i_world, &req.i)
                       : tb__mpi.p.Iallreduce(s, r, (int)n, tb__mpi.p_types[t], tb__mpi.p_ops[o],
                                              tb__mpi.p_world, &req.p);
        st = tb__mpi_wait(code, &req, "MPI_Iallreduce");
        if (st != TB_OK) return st;
        done += n;
    }
    return TB_OK;
}

static tb_status tb__mpi_all_gather(void *user_data, const void *send, void *recv, size_t bytes) {
    tb__mpi_request req = {NULL, 0};
    int code;
    tb_status st = tb__mpi_usable("MPI_Iallgather");
    (void)user_data;
    if (st != TB_OK) return st;
    if (bytes > (size_t)INT_MAX) {
        return tb__error(TB_ERR_UNSUPPORTED, "mpi: all_gather of %zu bytes per rank (at most %d)",
                         bytes, INT_MAX);
    }
    if (tb__mpi.abi == TB__MPI_ABI_MPICH) {
        int byte = tb__mpi.i_types[TB__MPI_TYPE_BYTE];
        code = tb__mpi.i.Iallgather(send, (int)bytes, byte, recv, (int)bytes, byte, tb__mpi.i_world,
                                    &req.i);
    } else {
        void *byte = tb__mpi.p_types[TB__MPI_TYPE_BYTE];
        code = tb__mpi.p.Iallgather(send, (int)bytes, byte, recv, (int)bytes, byte, tb__mpi.p_world,
                                    &req.p);
    }
    return tb__mpi_wait(code, &req, "MPI_Iallgather");
}

static tb_status tb__mpi_reduce_scatter(void *user_data, const void *send, void *recv, size_t count,
                                        tb_dtype dtype, tb_reduce_op op) {
    int t = tb__mpi_type_index(dtype), o = tb__mpi_op_index(op), code;
    tb__mpi_request req = {NULL, 0};
    tb_status st = tb__mpi_usable("MPI_Ireduce_scatter_block");
    (void)user_data;
    if (st != TB_OK) return st;
    if (t < 0 || o < 0) {
        return tb__error(TB_ERR_INTERNAL, "mpi: reduce_scatter of %s with op %d",
                         tb_dtype_name(dtype), (int)op);
    }
    if (count > (size_t)INT_MAX) {
        return tb__error(TB_ERR_UNSUPPORTED,
                         "mpi: reduce_scatter of %zu values per rank (at most %d)", count, INT_MAX);
    }
    code = tb__mpi.abi == TB__MPI_ABI_MPICH
               ? tb__mpi.i.Ireduce_scatter_block(send, recv, (int)count, tb__mpi.i_types[t],
                                                 tb__mpi.i_ops[o], tb__mpi.i_world, &req.i)
               : tb__mpi.p.Ireduce_scatter_block(send, recv, (int)count, tb__mpi.p_types[t],
                                                 tb__mpi.p_ops[o], tb__mpi.p_world, &req.p);
    return tb__mpi_wait(code, &req, "MPI_Ireduce_scatter_block");
}

static tb_status tb__mpi_broadcast(void *user_data, void *buf, size_t bytes, int32_t root) {
    size_t done = 0;
    tb_status st = tb__mpi_usable("MPI_Ibcast");
    (void)user_data;
    if (st != TB_OK) return st;
    while (done < bytes) {
        size_t n = bytes - done < (size_t)INT_MAX ? bytes - done : (size_t)INT_MAX;
        char *b = (char *)buf + done;
        tb__mpi_request req = {NULL, 0};
        int code = tb__mpi.abi == TB__MPI_ABI_MPICH
                       ? tb__mpi.i.Ibcast(b, (int)n, tb__mpi.i_types[TB__MPI_TYPE_BYTE], (int)root,
                                          tb__mpi.i_world, &req.i)
                       : tb__mpi.p.Ibcast(b, (int)n, tb__mpi.p_types[TB__MPI_TYPE_BYTE], (int)root,
                                          tb__mpi.p_world, &req.p);
        st = tb__mpi_wait(code, &req, "MPI_Ibcast");
        if (st != TB_OK) return st;
        done += n;
    }
    return TB_OK;
}

static tb_status tb__mpi_barrier(void *user_data) {
    tb__mpi_request req = {NULL, 0};
    int code;
    tb_status st = tb__mpi_usable("MPI_Ibarrier");
    (void)user_data;
    if (st != TB_OK) return st;
    code = tb__mpi.abi == TB__MPI_ABI_MPICH ? tb__mpi.i.Ibarrier(tb__mpi.i_world, &req.i)
                                            : tb__mpi.p.Ibarrier(tb__mpi.p_world, &req.p);
    return tb__mpi_wait(code, &req, "MPI_Ibarrier");
}

/* MPI_Finalize when MPI_Init was ours, unless a collective timed out (MPI_Finalize would wait
   for the rank that is missing). The library stays open: MPI cannot start again in this
   process, and unloading it under its own helper threads is not safe. */
static void tb__mpi_finalize(void *user_data) {
    int flag = 0;
    (void)user_data;
    if (tb__mpi.lib == NULL || !tb__mpi.initialized_here || tb__mpi.broken[0] != '\0') return;
    if (tb__mpi.common.Finalized(&flag) == 0 && !flag) tb__mpi.common.Finalize();
    tb__mpi.initialized_here = false;
}

static tb_process_group_impl tb__mpi_group_impl(void) {
    tb_process_group_impl impl;
    memset(&impl, 0, sizeof impl);
    impl.init = tb__mpi_init;
    impl.all_reduce = tb__mpi_all_reduce;
    impl.all_gather = tb__mpi_all_gather;
    impl.reduce_scatter = tb__mpi_reduce_scatter;
    impl.broadcast = tb__mpi_broadcast;
    impl.barrier = tb__mpi_barrier;
    impl.finalize = tb__mpi_finalize;
    return impl;
}

#else /* no dlopen */

static tb_status tb__mpi_unavailable(void *user_data, int32_t *rank, int32_t *size) {
    (void)user_data, (void)rank, (void)size;
    return tb__error(TB_ERR_UNAVAILABLE, "mpi: this build has no MPI loader (TB_NO_MPI, or a "
                                         "platform without dlopen)");
}

static tb_process_group_impl tb__mpi_group_impl(void) {
    tb_process_group_impl impl;
    memset(&impl, 0, sizeof impl);
    impl.init = tb__mpi_unavailable;
    return impl;
}

#endif /* TB__HAVE_MPI */
