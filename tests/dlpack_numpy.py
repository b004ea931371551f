"""DLPack between torch_backend.h and numpy, through ctypes.

Usage: python3 tests/dlpack_numpy.py PATH/libtb_dlpack_shim.so   (tests/test_dlpack.c runs it)
Exit status: 0 passed, 77 numpy is not installed (skip), 1 a check failed.

(a) numpy.from_dlpack reads our export without a copy: the array's data pointer is our buffer,
    and our deleter runs exactly once, when the array dies.
(b) tb_dlpack_import reads numpy's __dlpack__ capsule: in place when C-contiguous (the tensor's
    buffer is the array's), copied when strided; numpy's deleter runs exactly once, on the
    release of the tensor or at once after a copy; unsupported dtypes are refused and leave the
    capsule to numpy.
(c) bf16 (kDLBfloat, 16 bits), which numpy lacks, both ways with PyTorch where it imports
    (torch.utils.dlpack): our export read by torch.from_dlpack, torch's capsule imported.
"""
import ctypes
import gc
import sys

try:
    import numpy as np
except ImportError:
    print("numpy is not installed")
    sys.exit(77)

failures = []


def check(condition, what):
    """Prints the outcome; a failure also shows the library's last error."""
    if condition:
        print("ok   " + what)
    else:
        print("FAIL %s (last error: %s)" % (what, lib.shim_last_error().decode()))
        failures.append(what)


lib = ctypes.PyDLL(sys.argv[1])
for name in ("shim_source_address", "shim_export_borrowed", "shim_export_arange",
             "shim_import", "shim_tensor_address"):
    getattr(lib, name).restype = ctypes.c_void_p
lib.shim_export_arange.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
lib.shim_import.argtypes = [ctypes.c_void_p]
lib.shim_tensor_address.argtypes = [ctypes.c_void_p]
lib.shim_tensor_to_host.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
lib.shim_release.argtypes = [ctypes.c_void_p]
lib.shim_last_error.restype = ctypes.c_char_p

py = ctypes.pythonapi
py.PyCapsule_New.restype = ctypes.py_object
py.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
py.PyCapsule_GetPointer.restype = ctypes.c_void_p
py.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
py.PyCapsule_SetName.restype = ctypes.c_int
py.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
py.PyCapsule_GetName.restype = ctypes.c_char_p
py.PyCapsule_GetName.argtypes = [ctypes.py_object]

# A capsule keeps the name pointer it is given: these buffers live as long as the module.
DLTENSOR = ctypes.create_string_buffer(b"dltensor")
USED_DLTENSOR = ctypes.create_string_buffer(b"used_dltensor")
DESTRUCTOR = ctypes.cast(lib.shim_capsule_destructor, ctypes.c_void_p)

TB_DTYPES = {np.float32: 0, np.float64: 1, np.int32: 2, np.int64: 3, np.uint8: 4, np.float16: 6}
TB_BF16 = 7


class Exported:
    """What numpy.from_dlpack wants: __dlpack__ giving a "dltensor" capsule, and the device."""

    def __init__(self, managed):
        self.managed = managed

    def __dlpack__(self, stream=None):
        return py.PyCapsule_New(self.managed, DLTENSOR, DESTRUCTOR)

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU


# ---- (a) numpy reads our tensors ----
managed = lib.shim_export_borrowed()
check(managed is not None, "export of a borrowed cpu tensor")
arr = np.from_dlpack(Exported(managed))
check(arr.dtype == np.float32 and arr.shape == (2, 3), "from_dlpack: f32 (2, 3)")
check(arr.tolist() == [[i * 0.5 - 1 for i in range(r * 3, r * 3 + 3)] for r in range(2)],
      "from_dlpack: values")
check(arr.ctypes.data == lib.shim_source_address(),
      "from_dlpack: no copy (the array's data is the tensor's buffer)")
check(lib.shim_export_deleter_count() == 0, "export: the deleter waits for the array")
view = arr[1:]
del arr
gc.collect()
check(lib.shim_export_deleter_count() == 0, "export: a view of the array keeps the buffer")
check(view.tolist() == [[0.5, 1.0, 1.5]], "export: the view still reads the values")
del view
gc.collect()
check(lib.shim_export_deleter_count() == 1, "export: the deleter ran once with the last array")

for dtype, code in TB_DTYPES.items():
    before = lib.shim_export_deleter_count()
    managed = lib.shim_export_arange(code, 3, 4)
    check(managed is not None, "export arange %s" % dtype.__name__)
    arr = np.from_dlpack(Exported(managed))
    want = np.arange(12).reshape(3, 4).astype(dtype)
    check(arr.dtype == want.dtype and arr.shape == (3, 4) and np.array_equal(arr, want),
          "from_dlpack %s: dtype, shape and values" % dtype.__name__)
    del arr
    gc.collect()
    check(lib.shim_export_deleter_count() == before + 1, "export %s: deleter once" % dtype.__name__)

# An export whose capsule nobody consumes: the capsule's destructor runs the deleter.
before = lib.shim_export_deleter_count()
capsule = Exported(lib.shim_export_arange(0, 2, 2)).__dlpack__()
del capsule
gc.collect()
check(lib.shim_export_deleter_count() == before + 1, "an unconsumed capsule runs the deleter")


# ---- (b) we read numpy arrays ----
def import_array(array):
    """tb_dlpack_import of the array's capsule; the capsule is renamed once we own it."""
    capsule = array.__dlpack__()
    producer = py.PyCapsule_GetPointer(capsule, DLTENSOR)
    tensor = lib.shim_import(producer)
    if tensor is not None:
        py.PyCapsule_SetName(capsule, USED_DLTENSOR)
    return tensor, capsule


def read_back(tensor, like):
    out = np.empty(like.shape, like.dtype)
    status = lib.shim_tensor_to_host(tensor, out.ctypes.data, out.nbytes)
    return out if status == 0 else None


for dtype in TB_DTYPES:
    a = (np.arange(12).reshape(3, 4) * 3 - 7).astype(dtype)
    refs = sys.getrefcount(a)
    calls = lib.shim_import_deleter_count()
    tensor, capsule = import_array(a)
    check(tensor is not None, "import %s" % dtype.__name__)
    check(py.PyCapsule_GetName(capsule) == b"used_dltensor", "import: the capsule is renamed")
    del capsule
    gc.collect()
    check(lib.shim_import_deleter_count() == calls, "import %s: the deleter waits for the tensor"
          % dtype.__name__)
    check(lib.shim_tensor_address(tensor) == a.ctypes.data,
          "import %s: no copy (the tensor's buffer is the array's)" % dtype.__name__)
    got = read_back(tensor, a)
    check(got is not None and np.array_equal(got, a), "import %s: values" % dtype.__name__)
    lib.shim_release(tensor)
    gc.collect()
    check(lib.shim_import_deleter_count() == calls + 1,
          "import %s: the deleter ran once with the tensor's release" % dtype.__name__)
    check(sys.getrefcount(a) == refs, "import %s: numpy's reference is gone" % dtype.__name__)

# Strided arrays are copied; the deleter runs at once.
base = np.arange(24, dtype=np.float64).reshape(4, 6) / 4
for name, a in (("transposed", base.T), ("sliced", base[1:, ::2]), ("reversed", base[::-1])):
    calls = lib.shim_import_deleter_count()
    tensor, capsule = import_array(a)
    check(tensor is not None, "import %s" % name)
    del capsule
    check(lib.shim_import_deleter_count() == calls + 1, "import %s: deleter ran at once" % name)
    got = read_back(tensor, a)
    check(got is not None and np.array_equal(got, a), "import %s: values" % name)
    lib.shim_release(tensor)
    check(lib.shim_import_deleter_count() == calls + 1, "import %s: deleter ran once" % name)

# Unsupported dtypes are refused; the capsule keeps ownership and numpy frees it.
for dtype in (np.complex64, np.int16):
    a = np.zeros((2, 2), dtype)
    refs = sys.getrefcount(a)
    calls = lib.shim_import_deleter_count()
    tensor, capsule = import_array(a)
    message = lib.shim_last_error().decode()
    check(tensor is None and "tb_dlpack_import" in message and "not supported" in message,
          "import %s refused: %s" % (dtype.__name__, message))
    check(py.PyCapsule_GetName(capsule) == b"dltensor", "refused: the capsule stays numpy's")
    del capsule
    gc.collect()
    check(lib.shim_import_deleter_count() == calls, "refused: our deleter never ran")
    check(sys.getrefcount(a) == refs, "refused: numpy freed its capsule")

# numpy 1.25 and later export bool arrays as kDLBool, 8 bits; older ones refuse them.
try:
    a = np.array([[True, False, True], [False, False, True]])
    capsule = a.__dlpack__()
    del capsule
    tensor, capsule = import_array(a)
    check(tensor is not None, "import bool")
    got = read_back(tensor, a)
    check(got is not None and np.array_equal(got, a), "import bool: values")
    lib.shim_release(tensor)
except (TypeError, BufferError) as e:
    print("skip bool: this numpy does not export bool arrays (%s)" % e)

# ---- (c) bf16 with PyTorch ----
try:
    import torch
    import torch.utils.dlpack
except Exception as e:  # noqa: BLE001 (no torch: skip this part)
    torch = None
    print("skip bf16: PyTorch does not import (%s)" % str(e).replace("\n", " "))
if torch is not None:
    before = lib.shim_export_deleter_count()
    t = torch.utils.dlpack.from_dlpack(Exported(lib.shim_export_arange(TB_BF16, 3, 4)))
    check(t.dtype == torch.bfloat16 and tuple(t.shape) == (3, 4) and
          t.float().tolist() == [[float(r * 4 + c) for c in range(4)] for r in range(3)],
          "torch.from_dlpack bf16: dtype, shape and values")
    del t
    gc.collect()
    check(lib.shim_export_deleter_count() == before + 1, "export bf16: deleter once")
    for dt in (torch.bfloat16, torch.float16):
        src = (torch.arange(12, dtype=torch.float32).reshape(3, 4) * 0.3 - 1).to(dt)
        capsule = torch.utils.dlpack.to_dlpack(src)
        tensor = lib.shim_import(py.PyCapsule_GetPointer(capsule, DLTENSOR))
        check(tensor is not None, "import torch %s" % dt)
        if tensor is not None:
            py.PyCapsule_SetName(capsule, USED_DLTENSOR)
            out = torch.empty(3, 4, dtype=dt)
            status = lib.shim_tensor_to_host(tensor, out.data_ptr(), 24)
            check(status == 0 and torch.equal(out, src), "import torch %s: values" % dt)
            lib.shim_release(tensor)
        del capsule

lib.shim_shutdown()
if failures:
    print("%d check(s) failed" % len(failures))
    sys.exit(1)
print("all checks passed")
