/* A shared object that tests/dlpack_numpy.py loads with ctypes.PyDLL (calls hold the GIL, which
   numpy's DLPack deleter needs): small C functions over the DLPack interop, plus counters of
   the deleters that ran. Built by tests/test_dlpack.c:
       cc -std=c11 -shared -fPIC -I. tests/dlpack_shim.c -o libtb_dlpack_shim.so -ldl -lpthread -lm
   The capsule destructor calls two functions of Python's C API, declared here and resolved
   against the interpreter that loads this object: no Python headers are needed to build it. */
#define TB_IMPLEMENTATION
#include "torch_backend.h"

#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__) || defined(__clang__)
#define SHIM_EXPORT __attribute__((visibility("default")))
#else
#define SHIM_EXPORT
#endif

/* The values the exported tensors hold: element i is i * 0.5 - 1. */
static float shim_source[2 * 3];

static int shim_import_deleter_calls;
static int shim_export_deleter_calls;
static void (*shim_export_original_deleter)(tb_dl_managed_tensor *self);

/* ---- export: our tensors to numpy ---- */

static void shim_counting_export_deleter(tb_dl_managed_tensor *self) {
    shim_export_deleter_calls++;
    shim_export_original_deleter(self);
}

static tb_dl_managed_tensor *shim_export(tb_tensor *t) {
    tb_dl_managed_tensor *managed = NULL;
    if (tb_dlpack_export(t, &managed) != TB_OK) return NULL;
    shim_export_original_deleter = managed->deleter;
    managed->deleter = shim_counting_export_deleter;
    return managed;
}

SHIM_EXPORT void *shim_source_address(void) {
    return shim_source;
}

/* A cpu tensor borrowing shim_source, exported (no copy), the tensor itself already released. */
SHIM_EXPORT void *shim_export_borrowed(void) {
    int64_t dims[2] = {2, 3};
    tb_shape shape;
    tb_device cpu;
    tb_tensor *t;
    tb_dl_managed_tensor *managed;
    int i;
    for (i = 0; i < 6; ++i)
        shim_source[i] = (float)i * 0.5f - 1.0f;
    if (tb_shape_make(&shape, TB_F32, 2, dims) != TB_OK) return NULL;
    if (tb_device_make("cpu", 0, &cpu) != TB_OK) return NULL;
    t = tb_tensor_from_host_borrowed(shim_source, &shape, &cpu);
    managed = shim_export(t);
    tb_tensor_release(t);
    return managed;
}

/* arange(n0 * n1) as [n0, n1] of `dtype` (a tb_dtype), computed on the cpu device, exported. */
SHIM_EXPORT void *shim_export_arange(int dtype, int n0, int n1) {
    int64_t dims[2];
    tb_device cpu;
    tb_tensor *a, *r;
    tb_dl_managed_tensor *managed;
    dims[0] = n0;
    dims[1] = n1;
    if (tb_device_make("cpu", 0, &cpu) != TB_OK) return NULL;
    a = tb_arange(0.0, (double)n0 * n1, 1.0, TB_I64, &cpu);
    r = tb_cast(tb_reshape(a, dims, 2), (tb_dtype)dtype);
    managed = shim_export(r);
    tb_tensor_release(a);
    tb_tensor_release(r);
    return managed;
}

SHIM_EXPORT int shim_export_deleter_count(void) {
    return shim_export_deleter_calls;
}

/* What the capsule of an export that was never consumed does: per the DLPack protocol, a
   capsule still named "dltensor" when it dies calls the deleter. */
typedef struct shim_py_object shim_py_object;
extern int PyCapsule_IsValid(shim_py_object *capsule, const char *name);
extern void *PyCapsule_GetPointer(shim_py_object *capsule, const char *name);

SHIM_EXPORT void shim_capsule_destructor(shim_py_object *capsule) {
    tb_dl_managed_tensor *managed;
    if (!PyCapsule_IsValid(capsule, "dltensor")) return;
    managed = (tb_dl_managed_tensor *)PyCapsule_GetPointer(capsule, "dltensor");
    if (managed != NULL && managed->deleter != NULL) managed->deleter(managed);
}

/* ---- import: numpy arrays to our tensors ---- */

/* The managed tensor handed to tb_dlpack_import: a copy of the producer's whose deleter counts,
   calls the producer's deleter and frees the copy. */
typedef struct shim_wrapper {
    tb_dl_managed_tensor managed;
    tb_dl_managed_tensor *original;
} shim_wrapper;

static void shim_counting_import_deleter(tb_dl_managed_tensor *self) {
    shim_wrapper *w = (shim_wrapper *)self->manager_ctx;
    shim_import_deleter_calls++;
    if (w->original->deleter != NULL) w->original->deleter(w->original);
    free(w);
}

/* Imports the producer's managed tensor onto the cpu device; NULL on error (the producer keeps
   ownership then: its deleter has not run). */
SHIM_EXPORT void *shim_import(void *producer) {
    shim_wrapper *w = (shim_wrapper *)malloc(sizeof *w);
    tb_device cpu;
    tb_tensor *t;
    if (w == NULL) return NULL;
    w->original = (tb_dl_managed_tensor *)producer;
    w->managed.dl_tensor = w->original->dl_tensor;
    w->managed.manager_ctx = w;
    w->managed.deleter = shim_counting_import_deleter;
    t = tb_device_make("cpu", 0, &cpu) == TB_OK ? tb_dlpack_import(&w->managed, &cpu) : NULL;
    if (t == NULL) free(w);
    return t;
}

SHIM_EXPORT int shim_import_deleter_count(void) {
    return shim_import_deleter_calls;
}

/* The address of the tensor's host buffer (what an export of it points at). */
SHIM_EXPORT void *shim_tensor_address(void *tensor) {
    tb_dl_managed_tensor *managed = NULL;
    void *address;
    if (tb_dlpack_export((tb_tensor *)tensor, &managed) != TB_OK) return NULL;
    address = managed->dl_tensor.data;
    managed->deleter(managed);
    return address;
}

SHIM_EXPORT int shim_tensor_to_host(void *tensor, void *dst, size_t size) {
    return (int)tb_tensor_to_host((tb_tensor *)tensor, dst, size);
}

SHIM_EXPORT void shim_release(void *tensor) {
    tb_tensor_release((tb_tensor *)tensor);
}

SHIM_EXPORT const char *shim_last_error(void) {
    return tb_last_error();
}

SHIM_EXPORT void shim_shutdown(void) {
    tb_shutdown();
}
