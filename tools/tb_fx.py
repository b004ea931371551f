"""torch_backend.h as a torch.fx compiler: PyTorch models on any OpenCL device or the CPU.

    import sys; sys.path.insert(0, "tools")
    import tb_fx
    fast = tb_fx.compile(model.eval(), [x], device="opencl:0")
    y = fast(x)                       # a torch.Tensor, computed by the library

`compile(module_or_graph_module, example_inputs, device=..., strict=False)` has the signature of
torch._dynamo's CompilerFn (a GraphModule and example inputs in, a callable out), so on
PyTorch >= 2 `torch.compile(model, backend=tb_fx.compile)` takes it, and importing this module
registers it there under the name "torch_backend". On PyTorch 1.13 a plain nn.Module is traced
with torch.fx.symbolic_trace first.

What it does: the graph's parameters and buffers go to the device once (a batch norm after a
convolution in eval mode is folded into its weights); each call hands the inputs to the
library, records the graph's ops on its lazy tensors (the library caches the compiled kernels
by the graph's structure, so every call after the first runs them straight away) and hands the
outputs back as torch tensors. Inputs (and, in training, the parameters at each call) and
outputs go through DLPack: on devices that keep or share host memory (cpu, native, PoCL's
OpenCL devices) without a copy (an input is read in place while the library holds it; an
output is the library's buffer), on others copied. The first inference call with inputs of
a given shape records the library calls its walk over the graph makes; later calls with inputs
of that shape replay them on the new inputs, without the walk. Inference only (eval mode: dropout is the identity, batch norm uses
its running statistics). A node the library has no lowering for runs in PyTorch on the host
(its inputs downloaded, its result uploaded again), reported once with its name;
strict=True makes such a node an error at compile time instead.

The library is built as a shared object from the project's torch_backend.h at first use (the
C compiler of $CC, else cc) and kept under $XDG_CACHE_HOME/torch_backend (else
~/.cache/torch_backend), named by a hash of the header, so a changed header builds a new one.
Standard library, torch and ctypes only.
"""
import ctypes
import dis
import hashlib
import inspect
import math
import operator
import os
import shlex
import subprocess
import tempfile
import warnings

import torch
import torch.fx
import torch.nn as nn
import torch.utils.dlpack
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADER = os.path.join(ROOT, "torch_backend.h")
MAX_RANK = 8
DTYPES = {torch.float32: 0, torch.float64: 1, torch.int32: 2, torch.int64: 3, torch.uint8: 4,
          torch.bool: 5, torch.float16: 6, torch.bfloat16: 7}
TORCH_OF = {v: k for k, v in DTYPES.items()}


class Error(RuntimeError):
    """A failure of the library (its message from tb_last_error) or of the lowering."""


class _Shape(ctypes.Structure):
    _fields_ = [("dtype", ctypes.c_int), ("rank", ctypes.c_int32),
                ("dims", ctypes.c_int64 * MAX_RANK)]


class _Device(ctypes.Structure):
    _fields_ = [("backend", ctypes.c_char * 32), ("type", ctypes.c_int), ("ordinal", ctypes.c_int32)]


_T = ctypes.c_void_p
_TP = ctypes.POINTER(_T)
_I64P = ctypes.POINTER(ctypes.c_int64)
_I32P = ctypes.POINTER(ctypes.c_int32)
_SIGNATURES = {
    "tb_last_error": (ctypes.c_char_p, []),
    "tb_last_status": (ctypes.c_int, []),
    "tb_metrics_counter": (ctypes.c_int64, [ctypes.c_char_p]),
    "tb_tensor_retain": (_T, [_T]),
    "tb_clear_error": (None, []),
    "tb_device_parse": (ctypes.c_int, [ctypes.c_char_p, ctypes.POINTER(_Device)]),
    "tb_tensor_from_host": (_T, [ctypes.c_void_p, ctypes.POINTER(_Shape), ctypes.POINTER(_Device)]),
    "tb_tensor_to_host": (ctypes.c_int, [_T, ctypes.c_void_p, ctypes.c_size_t]),
    "tb_dlpack_import": (_T, [ctypes.c_void_p, ctypes.POINTER(_Device)]),
    "tb_dlpack_export": (ctypes.c_int, [_T, ctypes.POINTER(ctypes.c_void_p)]),
    "tb_tensor_shape": (_Shape, [_T]),
    "tb_tensor_release": (None, [_T]),
    "tb_sync": (ctypes.c_int, [ctypes.POINTER(_T), ctypes.c_size_t]),
    "tb_scope_begin": (ctypes.c_int, []),
    "tb_scope_end": (ctypes.c_int, []),
    "tb_scope_keep": (_T, [_T]),
    "tb_conv2d": (_T, [_T, _T, _T, _I64P, _I64P, _I64P, ctypes.c_int64]),
    "tb_batch_norm": (_T, [_T, _T, _T, _T, _T, ctypes.c_bool, ctypes.c_double, ctypes.c_double]),
    "tb_batch_norm_fold": (ctypes.c_int, [_T, _T, _T, _T, _T, _T, ctypes.c_double,
                                          ctypes.POINTER(_T), ctypes.POINTER(_T)]),
    "tb_linear": (_T, [_T, _T, _T]),
    "tb_max_pool2d": (_T, [_T, _I64P, _I64P, _I64P, _I64P, ctypes.c_bool]),
    "tb_avg_pool2d": (_T, [_T, _I64P, _I64P, _I64P, ctypes.c_bool, ctypes.c_bool]),
    "tb_adaptive_avg_pool2d": (_T, [_T, _I64P]),
    "tb_layer_norm": (_T, [_T, ctypes.c_int32, _T, _T, ctypes.c_double]),
    "tb_softmax": (_T, [_T, ctypes.c_int32]),
    "tb_hardtanh": (_T, [_T, ctypes.c_double, ctypes.c_double]),
    "tb_clamp": (_T, [_T, ctypes.c_double, ctypes.c_double]),
    "tb_add_scalar": (_T, [_T, ctypes.c_double]),
    "tb_mul_scalar": (_T, [_T, ctypes.c_double]),
    "tb_reshape": (_T, [_T, _I64P, ctypes.c_int32]),
    "tb_permute": (_T, [_T, _I32P, ctypes.c_int32]),
    "tb_transpose": (_T, [_T, ctypes.c_int32, ctypes.c_int32]),
    "tb_concat": (_T, [ctypes.POINTER(_T), ctypes.c_size_t, ctypes.c_int32]),
    "tb_mean": (_T, [_T, _I32P, ctypes.c_size_t, ctypes.c_bool]),
    "tb_sum": (_T, [_T, _I32P, ctypes.c_size_t, ctypes.c_bool]),
    "tb_matmul": (_T, [_T, _T]),
    "tb_set_requires_grad": (ctypes.c_int, [_T, ctypes.c_bool]),
    "tb_grad": (ctypes.c_int, [_T, _T, ctypes.POINTER(_T), ctypes.c_size_t, ctypes.POINTER(_T)]),
    "tb_sync_for_grad": (ctypes.c_int, [ctypes.POINTER(_T), ctypes.c_size_t, ctypes.POINTER(_T),
                                        ctypes.c_size_t]),
    "tb_dropout": (_T, [_T, ctypes.c_double, ctypes.c_bool]),
    "tb_ones": (_T, [ctypes.POINTER(_Shape), ctypes.POINTER(_Device)]),
    "tb_expand": (_T, [_T, _I64P, ctypes.c_int32]),
    "tb_squeeze": (_T, [_T, ctypes.c_int32]),
    "tb_index_select": (_T, [_T, ctypes.c_int32, _T]),
    "tb_slice": (_T, [_T, ctypes.c_int32, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]),
    "tb_pad": (_T, [_T, _I64P, ctypes.c_size_t, ctypes.c_double]),
    "tb_function_create": (ctypes.c_void_p, [ctypes.POINTER(_T), ctypes.c_size_t,
                                             ctypes.POINTER(_T), ctypes.c_size_t]),
    "tb_function_call": (ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(_T), ctypes.c_size_t,
                                        ctypes.POINTER(_T), ctypes.c_size_t]),
    "tb_function_release": (None, [ctypes.c_void_p]),
    "tb_scaled_dot_product_attention": (_T, [_T, _T, _T, _T, ctypes.c_double, ctypes.c_bool,
                                             ctypes.c_double]),
}
for _name in ("relu", "relu6", "sigmoid", "tanh", "gelu", "silu", "hardswish", "hardsigmoid",
              "neg", "exp", "sqrt", "softplus", "mish"):
    _SIGNATURES["tb_" + _name] = (_T, [_T])
for _name in ("add", "sub", "mul", "div"):
    _SIGNATURES["tb_" + _name] = (_T, [_T, _T])

_lib = None

# DLPack capsules ("dltensor", renamed "used_dltensor" once a consumer owns the tensor)
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_rename = ctypes.pythonapi.PyCapsule_SetName
_capsule_rename.restype = ctypes.c_int
_capsule_rename.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


def library():
    """The library as a ctypes.CDLL, built from torch_backend.h on first use."""
    global _lib
    if _lib is not None:
        return _lib
    with open(HEADER, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:16]
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    folder = os.path.join(cache, "torch_backend")
    path = os.path.join(folder, "libtorch_backend-%s.so" % digest)
    if not os.path.exists(path):
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=folder)
        os.close(fd)
        cmd = shlex.split(os.environ.get("CC", "cc")) + [
            "-O2", "-shared", "-fPIC", "-DTB_IMPLEMENTATION", "-x", "c", HEADER, "-o", tmp,
            "-ldl", "-lpthread", "-lm"]
        built = subprocess.run(cmd, capture_output=True, text=True)
        if built.returncode != 0:
            os.unlink(tmp)
            raise Error("building the library failed: %s\n%s" % (" ".join(cmd), built.stderr))
        os.replace(tmp, path)  # atomic: a concurrent build leaves one whole file
    lib = ctypes.CDLL(path)
    for name, (res, args) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    _lib = lib
    return lib


def _err(what):
    msg = library().tb_last_error()
    return Error("%s: %s" % (what, msg.decode() if msg else "failed"))


def _ints(values, ctype=ctypes.c_int64):
    values = list(values)
    return (ctype * max(len(values), 1))(*values)


def _shape(dtype, dims):
    """The library's tb_shape of a torch dtype and dims."""
    return _Shape(DTYPES[dtype], len(dims), (ctypes.c_int64 * MAX_RANK)(*dims))


def _pair(v):
    return list(v) if isinstance(v, (tuple, list)) else [v, v]


class _State(dict):
    """What a call keeps (its outputs, leaves and, in training, the values its backward reads):
    released by the backward, or else when the call's autograd node goes (outputs never
    differentiated) so that a call without a backward leaks nothing."""

    def __init__(self, lib, **fields):
        super().__init__(**fields)
        self.lib = lib

    def release(self):
        keep, self["keep"] = self.get("keep", []), []
        for h in keep:
            self.lib.tb_tensor_release(h)

    def __del__(self):
        try:
            self.release()
        except Exception:  # noqa: BLE001 (interpreter shutdown: the library may be gone)
            pass


class _Graph:
    """One traced graph lowered onto the library for `device`."""

    def __init__(self, gm, device, strict):
        self.lib = library()
        self.gm = gm
        self.device = _Device()
        if self.lib.tb_device_parse(device.encode(), ctypes.byref(self.device)) != 0:
            raise _err("device %r" % device)
        self.params = {}   # (module path, name) -> tensor handle on the device
        self.call_params = None  # training: this call's uploads of the same
        self.folded = {}   # conv module path -> (weight, bias) with its batch norm folded in
        self.skip = set()  # batch norm nodes folded into the convolution before them
        self.fallback = []
        self.tapes = {}  # inference: a call as a library function, per signature of its inputs
        self.consts = {}  # key -> a tensor a lowering made from sizes alone (constant())
        self.modules = dict(gm.named_modules())
        self.nodes = list(gm.graph.nodes)
        # training (the traced module, or a module a node calls, in training mode; not the
        # containers fx makes to hold the hierarchy): parameters uploaded at every call (an
        # optimizer changes them between calls), batch norms on the batch's statistics
        self.training = self.mode() != []
        for node in self.nodes:
            if not self._lowerable(node):
                if strict:
                    raise Error("tb_fx: no lowering for node %s (%s %s)" % (
                        node.name, node.op, _target_name(node.target)))
                self.fallback.append(node.name)
        if self.fallback:
            warnings.warn("tb_fx: these nodes run in PyTorch on the host: %s" %
                          ", ".join(self.fallback))
        # every parameter and buffer on the device now, outside any call's scope: kept there
        # for the life of the compiled graph
        self.attrs = {}
        self.param_keys = []  # (module path, name) of every parameter and buffer the graph reads
        for node in self.nodes:
            if node.op == "call_module" and isinstance(self.modules[node.target], LEAVES):
                # a module lowered whole: the tensors of its submodules too
                for sub, m in self.modules[node.target].named_modules(prefix=node.target):
                    for name, t in list(m.named_parameters(recurse=False)) + list(
                            m.named_buffers(recurse=False)):
                        if t.is_floating_point():
                            self.param_keys.append((sub, name))
            elif node.op == "call_module":
                for name in ("weight", "bias", "running_mean", "running_var"):
                    if isinstance(getattr(self.modules[node.target], name, None), torch.Tensor):
                        self.param_keys.append((node.target, name))
            elif node.op == "get_attr" and isinstance(_get_attr(gm, node.target), torch.Tensor):
                if self.training:  # uploaded at each call, as the modules' parameters
                    self.param_keys.append((None, node.target))
                else:
                    self.attrs[node.target] = self._upload(_get_attr(gm, node.target))
        if not self.training:
            for path, name in self.param_keys:
                self.param(path, name)
            self._fold_batch_norms()

    def mode(self):
        """The paths of the modules in training mode now ("" for the traced module itself)."""
        paths = [""] if self.gm.training else []
        for node in self.nodes:
            if node.op == "call_module" and self.modules[node.target].training:
                paths.append(node.target)
        return paths

    def param_values(self):
        """The current values of param_keys (module parameters and buffers, tensor attributes
        of the graph), in that order."""
        return [getattr(self.modules[p], n) if p is not None else _get_attr(self.gm, n)
                for p, n in self.param_keys]

    def __del__(self):
        lib = getattr(self, "lib", None)
        if lib is None:
            return
        held = (list(getattr(self, "params", {}).values()) +
                list(getattr(self, "attrs", {}).values()) +
                list(getattr(self, "consts", {}).values()))
        for tape in getattr(self, "tapes", {}).values():
            if tape is not None:
                tape.release()
        for t in held + [t for p in getattr(self, "folded", {}).values() for t in p]:
            if t:
                lib.tb_tensor_release(t)

    # ---- parameters ----

    def constant(self, key, make):
        """The tensor make() returns (torch, on the host; a function of sizes alone, such as a
        mask), on the device once per key and kept for the life of the graph, outside the
        call's scope: a later call, or a replay, reads it as it reads a parameter."""
        h = self.consts.get(key)
        if h is None:
            lib = self.lib.lib if isinstance(self.lib, _Recorder) else self.lib
            h = self._upload(make(), lib)  # past a recorder: not one of the call's ops
            lib.tb_scope_keep(h)  # the graph's from now on, not the open scope's
            self.consts[key] = h
        return Value(self, h)

    def _upload(self, t, lib=None):
        """A copy of t on the device, through `lib` (default: the graph's)."""
        t = t.detach().contiguous()
        if t.dtype not in DTYPES:
            raise Error("tb_fx: dtype %s is not supported" % t.dtype)
        shape = _shape(t.dtype, t.shape)
        h = (lib or self.lib).tb_tensor_from_host(ctypes.c_void_p(t.data_ptr()),
                                                  ctypes.byref(shape), ctypes.byref(self.device))
        if not h:
            raise _err("tb_tensor_from_host")
        return h

    def _import(self, t):
        """A call's input through DLPack: used in place where the device keeps or shares host
        memory (cpu, native, PoCL's OpenCL devices; the library holds the torch tensor until
        it lets go of it), copied elsewhere."""
        t = t.detach()
        if t.dtype not in DTYPES or t.dtype == torch.bool or t.device.type != "cpu":
            return self._upload(t)  # bool: torch's DLPack has none (1.13); others copied
        capsule = torch.utils.dlpack.to_dlpack(t.contiguous())
        h = self.lib.tb_dlpack_import(_capsule_pointer(capsule, b"dltensor"),
                                      ctypes.byref(self.device))
        if not h:
            raise _err("tb_dlpack_import")  # the capsule still owns the tensor and frees it
        _capsule_rename(capsule, b"used_dltensor")  # the library owns it now
        return h

    def param(self, path, name):
        """The device copy of a module's parameter or buffer (None when it has none): uploaded
        when the graph is compiled, kept until it is freed."""
        key = (path, name)
        if self.call_params is not None:
            return self.call_params.get(key)
        if key not in self.params:
            value = getattr(self.modules[path], name, None)
            self.params[key] = self._upload(value) if isinstance(value, torch.Tensor) else None
        return self.params[key]

    def _fold_batch_norms(self):
        """conv -> batch norm (eval, the conv's only user): the batch norm folded into it."""
        for node in self.nodes:
            if node.op != "call_module" or not isinstance(self.modules[node.target], nn.Conv2d):
                continue
            users = list(node.users)
            if len(users) != 1 or users[0].op != "call_module":
                continue
            bn = self.modules[users[0].target]
            if not isinstance(bn, nn.BatchNorm2d) or bn.training or bn.running_mean is None:
                continue
            w, b = _T(), _T()
            st = self.lib.tb_batch_norm_fold(
                self.param(node.target, "weight"), self.param(node.target, "bias"),
                self.param(users[0].target, "running_mean"),
                self.param(users[0].target, "running_var"),
                self.param(users[0].target, "weight"), self.param(users[0].target, "bias"),
                bn.eps, ctypes.byref(w), ctypes.byref(b))
            if st != 0:
                raise _err("tb_batch_norm_fold")
            pair = (_T * 2)(w, b)
            if self.lib.tb_sync(pair, 2) != 0:
                raise _err("tb_sync")
            self.folded[node.target] = (w.value, b.value)
            self.skip.add(users[0].name)

    # ---- lowering ----

    def _lowerable(self, node):
        if node.op in ("placeholder", "output", "get_attr"):
            return True
        if node.op == "call_module":
            return type(self.modules[node.target]) in MODULES
        if node.op == "call_function":
            return _function(node.target) is not None
        if node.op == "call_method":
            return node.target in METHODS
        return False

    def _upload_leaf(self, t, keep):
        """t on the device, requiring grad where t does (training), kept out of the call's
        scope and listed in `keep` (released by the caller, at the latest by the backward,
        before an optimizer changes t in place). Through DLPack, as a call's inputs."""
        h = self._import(t)
        if t.requires_grad and t.is_floating_point():
            if self.lib.tb_set_requires_grad(h, True) != 0:
                raise _err("tb_set_requires_grad")
        keep.append(self.lib.tb_scope_keep(h))
        return h

    def run(self, inputs, params=None, grad_of=()):
        """The graph's outputs for `inputs` as torch tensors. Training: `params` are the current
        values of self.param_keys, grad_of the positions in inputs + params of the tensors
        backward will want gradients of, and the result is (outputs, state) where state holds
        what backward needs (release it with release_state)."""
        lib = self.lib
        keep, leaves, kept = [], [], []
        if lib.tb_scope_begin() != 0:
            raise _err("tb_scope_begin")
        try:
            if self.training:
                self.call_params = {}
                for key, value in zip(self.param_keys, params):
                    self.call_params[key] = self._upload_leaf(value, keep)
            env = {}
            args_iter = iter(inputs)
            result = None
            tape, key = None, None
            if not self.training and not self.fallback:
                key = _signature(inputs)
                tape = self.tapes.get(key)
                if tape is None and key in self.tapes:
                    key = None  # refused before: walk without recording
            if tape is not None:  # the graph of the first call of this signature, in one call
                handles = [self._import(v) for v in inputs if isinstance(v, torch.Tensor)]
                leaves.extend(handles)
                kept = tape.replay(self, handles)
                result = tape.rebuild(kept)
            for node in self.nodes if tape is None else ():
                if node.op == "placeholder":
                    value = next(args_iter)
                    if isinstance(value, torch.Tensor):
                        h = (self._upload_leaf(value, keep) if self.training
                             else self._import(value))
                        leaves.append(h)
                        env[node.name] = Value(self, h)
                    else:
                        env[node.name] = value
                    if key is not None and node.next.op != "placeholder":
                        self.lib = _Recorder(lib)  # the graph's own calls from here
                        runs = lib.tb_metrics_counter(b"ExecuteTime")
                elif node.op == "output":
                    result = _map(node.args[0], lambda n: env[n.name])
                elif node.name in self.skip:
                    env[node.name] = env[node.args[0].name]
                elif node.op == "get_attr":
                    if self.training and (None, node.target) in self.call_params:
                        env[node.name] = Value(self, self.call_params[(None, node.target)])
                    elif node.target in self.attrs:
                        env[node.name] = Value(self, self.attrs[node.target])
                    else:
                        env[node.name] = _get_attr(self.gm, node.target)
                elif node.name in self.fallback:
                    env[node.name] = self._in_torch(node, env)
                else:
                    args = _map(node.args, lambda n: env[n.name])
                    kwargs = _map(node.kwargs, lambda n: env[n.name])
                    if node.op == "call_module":
                        env[node.name] = MODULES[type(self.modules[node.target])](
                            self, node.target, self.modules[node.target], *args, **kwargs)
                    elif node.op == "call_function":
                        env[node.name] = _function(node.target)(*args, **kwargs)
                    else:
                        env[node.name] = METHODS[node.target](*args, **kwargs)
            if tape is None:
                result = _map_values(result, lambda v: kept.append(v) or v)
                # a graph that ran while the walk made it (the library's automatic flush of
                # a graph past its size limit) is cut there: not one a function can stand for
                if (isinstance(self.lib, _Recorder) and self.lib.whole and
                        lib.tb_metrics_counter(b"ExecuteTime") == runs):
                    self.tapes[key] = _Tape.make(lib, leaves, result, kept)
                elif key is not None:
                    self.tapes[key] = None
            for v in kept:  # a reference of the call's own (an output may be a parameter)
                keep.append(lib.tb_tensor_retain(v.h))
        except BaseException:
            lib.tb_scope_end()
            for h in keep:
                lib.tb_tensor_release(h)
            raise
        finally:
            self.lib = lib
            call_params, self.call_params = self.call_params, None
        lib.tb_scope_end()
        state = _State(lib, keep=keep, outputs=[v.h for v in kept], leaves=leaves,
                       params=call_params)
        if self.training:  # the handles of inputs + params by position (None: not a tensor)
            handles = iter(leaves)
            every = ([next(handles) if isinstance(v, torch.Tensor) else None for v in inputs] +
                     [call_params[k] for k in self.param_keys])
            state["wanted"] = [every[i] for i in grad_of]
        try:
            # training: the batch norms' updated running statistics are computed in the same
            # graph as the outputs (read one by one afterwards, each would be a graph of its
            # own that computes the network again up to its batch norm), and the values the
            # backward reads are kept (else its graph would compute the forward again)
            synced = [v.h for v in kept] + ([h for _, h in self._running_stats(call_params)]
                                            if self.training else [])
            handles = (_T * max(len(synced), 1))(*synced)
            if self.training:
                wanted = (_T * max(len(state["wanted"]), 1))(*state["wanted"])
                if lib.tb_sync_for_grad(handles, len(synced), wanted,
                                        len(state["wanted"])) != 0:
                    raise _err("tb_sync_for_grad")
            elif synced and lib.tb_sync(handles, len(synced)) != 0:
                raise _err("tb_sync")
            out = _map_values(result, lambda v: v.to_torch())
            if self.training:
                self._store_running_stats(call_params)
                return out, state
            return out
        finally:
            if not self.training:
                self.release_state(state)

    @staticmethod
    def release_state(state):
        state.release()

    @staticmethod
    def _running_stats(call_params):
        """The batch norms' running statistics among a call's parameters: ((path, name),
        handle) pairs."""
        return [(key, h) for key, h in call_params.items()
                if key[1] in ("running_mean", "running_var") and h]

    def _store_running_stats(self, call_params):
        """Training: the batch norms' running statistics, updated on the device, back into the
        modules' buffers (as PyTorch's batch norm updates them)."""
        with torch.no_grad():
            for (path, name), h in self._running_stats(call_params):
                getattr(self.modules[path], name).copy_(Value(self, h).to_torch())
                if name == "running_mean" and hasattr(self.modules[path], "num_batches_tracked"):
                    self.modules[path].num_batches_tracked += 1

    def grads(self, state, grad_outputs, wanted):
        """The gradients of the call's outputs, seeded with grad_outputs (torch tensors or
        None), with respect to the handles `wanted`: torch tensors (None where no path)."""
        lib = self.lib
        total = [None] * len(wanted)
        arr = (_T * max(len(wanted), 1))(*wanted)
        for out, seed in zip(state["outputs"], grad_outputs):
            if seed is None:
                continue
            s = self._upload(seed)
            got = (_T * max(len(wanted), 1))()
            try:
                if lib.tb_grad(out, s, arr, len(wanted), got) != 0:
                    raise _err("tb_grad")
                present = [(i, got[i]) for i in range(len(wanted)) if got[i]]
                if present:
                    hs = (_T * len(present))(*[h for _, h in present])
                    if lib.tb_sync(hs, len(present)) != 0:
                        raise _err("tb_sync")
                for i, h in present:
                    g = Value(self, h).to_torch()
                    total[i] = g if total[i] is None else total[i] + g
            finally:
                lib.tb_tensor_release(s)
                for i in range(len(wanted)):
                    if got[i]:
                        lib.tb_tensor_release(got[i])
        return total

    def _in_torch(self, node, env):
        """A node without a lowering, run by PyTorch on the host."""
        to_torch = (lambda v: v.to_torch() if isinstance(v, Value) else v)
        args = _map(node.args, lambda n: to_torch(env[n.name]))
        kwargs = _map(node.kwargs, lambda n: to_torch(env[n.name]))
        if node.op == "call_module":
            out = self.modules[node.target](*args, **kwargs)
        elif node.op == "call_function":
            out = node.target(*args, **kwargs)
        else:
            out = getattr(args[0], node.target)(*args[1:], **kwargs)
        return _map_torch(out, lambda t: Value(self, self._upload(t)))


def _signature(inputs):
    """What decides the library calls of an inference call: the inputs' shapes and dtypes, and
    any other input's value."""
    return tuple((tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else ("=", repr(v))
                 for v in inputs)


class _Recorder:
    """The graph's library while the first inference call of a signature lowers its nodes:
    each call goes through. `whole` turns false at a call that a replay could not repeat (one
    that is not an op of the graph: an upload, a sync, a graph break's round trip through
    PyTorch)."""

    QUERIES = ("tb_tensor_shape", "tb_last_error", "tb_clear_error")
    OUTSIDE = ("tb_tensor_from_host", "tb_dlpack_import", "tb_dlpack_export", "tb_tensor_to_host",
               "tb_sync", "tb_scope_begin", "tb_scope_end", "tb_scope_keep", "tb_tensor_release",
               "tb_grad", "tb_set_requires_grad", "tb_batch_norm_fold")

    def __init__(self, lib):
        self.lib = lib
        self.whole = True

    def __getattr__(self, name):
        if name not in self.QUERIES and (name in self.OUTSIDE or name not in _SIGNATURES):
            self.whole = False
        return getattr(self.lib, name)


class _Tape:
    """The first inference call of a signature as a library function of its inputs
    (tb_function_create): a later call with inputs of that signature makes the same graph over
    its own inputs in one library call (the Python walk over the graph and its op calls done
    once), the outputs at the same places."""

    class Slot:
        def __init__(self, i):
            self.i = i

    # what tb_function_create says of a graph it cannot record (an output that is an input
    # or a parameter itself, no output, random numbers): the call walks the graph every time
    REFUSED = (1, 8, 15)  # TB_ERR_INVALID_ARGUMENT, TB_ERR_UNSUPPORTED, TB_ERR_STATE

    @staticmethod
    def make(lib, inputs, result, kept):
        """The tape, or None where the library cannot record this graph as a function."""
        ins = (_T * max(len(inputs), 1))(*inputs)
        outs = (_T * max(len(kept), 1))(*[v.h for v in kept])
        fn = lib.tb_function_create(ins, len(inputs), outs, len(kept))
        if not fn:
            if lib.tb_last_status() not in _Tape.REFUSED:
                raise _err("tb_function_create")
            lib.tb_clear_error()
            return None
        tape = _Tape()
        tape.lib, tape.fn = lib, fn
        try:
            tape.outputs = [(v.shape, v.dtype) for v in kept]
            tape.out_type = _T * max(len(kept), 1)
            slots = {id(v): _Tape.Slot(i) for i, v in enumerate(kept)}
            tape.result = _map_values(result, lambda v: slots[id(v)])
        except BaseException:
            tape.release()
            raise
        return tape

    def release(self):
        if self.fn:
            self.lib.tb_function_release(self.fn)
            self.fn = None

    def replay(self, graph, inputs):
        """The outputs' Values for `inputs` (handles, in the order of the recording's)."""
        outs = self.out_type()
        if self.lib.tb_function_call(self.fn, (_T * max(len(inputs), 1))(*inputs), len(inputs),
                                     outs, len(self.outputs)) != 0:
            raise _err("tb_function_call")
        out = []
        for h, (shape, dtype) in zip(outs, self.outputs):
            v = Value.__new__(Value)
            v.g, v.h, v.shape, v.dtype = graph, h, shape, dtype
            out.append(v)
        return out

    def rebuild(self, kept):
        """The call's result (its structure as recorded) with these outputs."""
        def walk(x):
            if isinstance(x, _Tape.Slot):
                return kept[x.i]
            if isinstance(x, (tuple, list)):
                return type(x)(walk(v) for v in x)
            if isinstance(x, dict):
                return {k: walk(v) for k, v in x.items()}
            return x
        return walk(self.result)


class Value:
    """A lazy tensor of the library inside one call (owned by the call's scope)."""

    def __init__(self, graph, handle):
        if not handle:
            raise _err("tb_fx")
        self.g = graph
        self.h = handle
        s = graph.lib.tb_tensor_shape(handle)
        self.shape = tuple(s.dims[:s.rank])
        self.dtype = TORCH_OF[s.dtype]

    def new(self, handle, what="tb_fx"):
        if not handle:
            raise _err(what)
        return Value(self.g, handle)

    def to_torch(self):
        """The value as a torch tensor through DLPack: the library's own buffer where the device
        keeps host memory or shares it (cpu, native, PoCL's OpenCL devices: no copy; the tensor
        holds the buffer), else a copy."""
        if self.dtype == torch.bool:  # torch's DLPack has no bool (1.13)
            out = torch.empty(self.shape, dtype=self.dtype)
            if self.g.lib.tb_tensor_to_host(self.h, ctypes.c_void_p(out.data_ptr()),
                                            out.numel() * out.element_size()) != 0:
                raise _err("tb_tensor_to_host")
            return out
        managed = ctypes.c_void_p()
        if self.g.lib.tb_dlpack_export(self.h, ctypes.byref(managed)) != 0:
            raise _err("tb_dlpack_export")
        return torch.utils.dlpack.from_dlpack(_capsule_new(managed, b"dltensor", None))

    def dim(self):
        return len(self.shape)

    def __getitem__(self, index):
        """Basic indexing: integers, slices (positive steps), None and Ellipsis."""
        index = index if isinstance(index, tuple) else (index,)
        if any(i is Ellipsis for i in index):
            at = index.index(Ellipsis)
            fill = len(self.shape) - sum(1 for i in index if i is not None and i is not Ellipsis)
            index = index[:at] + (slice(None),) * fill + index[at + 1:]
        out, dim, lib = self, 0, self.g.lib
        for item in index:
            if item is None:
                out = unsqueeze(out, dim)
                dim += 1
            elif isinstance(item, int):
                n = out.shape[dim]
                i = item + n if item < 0 else item
                if not 0 <= i < n:
                    raise Error("tb_fx: index %d is out of range for a dim of %d" % (item, n))
                out = out.new(lib.tb_slice(out.h, dim, i, i + 1, 1), "tb_slice")
                out = out.new(lib.tb_squeeze(out.h, dim), "tb_squeeze")
            elif isinstance(item, slice):
                start, stop, step = item.indices(out.shape[dim])
                if step <= 0:
                    raise Error("tb_fx: a slice with step %d is not lowered" % step)
                if (start, stop, step) != (0, out.shape[dim], 1):
                    out = out.new(lib.tb_slice(out.h, dim, start, max(stop, start), step),
                                  "tb_slice")
                dim += 1
            elif isinstance(item, Value) and item.dtype in (torch.int32, torch.int64) and sum(
                    isinstance(i, Value) for i in index) == 1:
                # one tensor of indices: a gather along dim, its shape in the dim's place
                flat = reshape(item, [-1])
                picked = out.new(lib.tb_index_select(out.h, dim, flat.h), "tb_index_select")
                out = reshape(picked, list(out.shape[:dim]) + list(item.shape) +
                              list(out.shape[dim + 1:]))
                dim += len(item.shape)
            else:
                raise Error("tb_fx: indexing with %s is not lowered" % (
                    "several tensors" if isinstance(item, Value) else type(item).__name__))
        return out

    def size(self, d=None):
        return torch.Size(self.shape) if d is None else self.shape[d]


def _target_name(t):
    return getattr(t, "__name__", str(t))


def _get_attr(gm, target):
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _map(a, fn):
    """fx's map_arg over nested tuples, lists and dicts."""
    return torch.fx.node.map_arg(a, fn)


def _map_values(x, fn):
    if isinstance(x, Value):
        return fn(x)
    if isinstance(x, (tuple, list)):
        return type(x)(_map_values(v, fn) for v in x)
    if isinstance(x, dict):
        return {k: _map_values(v, fn) for k, v in x.items()}
    return x


def _map_torch(x, fn):
    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, (tuple, list)):
        return type(x)(_map_torch(v, fn) for v in x)
    return x


# ---- ops on Values ----

def _unary(name):
    def op(x, *args, **kwargs):
        return x.new(getattr(x.g.lib, "tb_" + name)(x.h), "tb_" + name)
    return op


def _binary(name, scalar_op):
    numbers = {"add": operator.add, "sub": operator.sub, "mul": operator.mul,
               "div": operator.truediv}[name]

    def op(a, b, *, alpha=None):
        if not isinstance(a, Value) and not isinstance(b, Value):  # sizes, not tensors
            return numbers(a, b if alpha is None else b * alpha)
        lib = (a if isinstance(a, Value) else b).g.lib
        if alpha is not None and alpha != 1:
            b = b * alpha if not isinstance(b, Value) else b.new(lib.tb_mul_scalar(b.h, alpha))
        if isinstance(a, Value) and isinstance(b, Value):
            return a.new(getattr(lib, "tb_" + name)(a.h, b.h), "tb_" + name)
        if isinstance(a, Value):
            return scalar_op(a, float(b))
        if name in ("add", "mul"):
            return scalar_op(b, float(a))
        if name == "sub":  # s - x
            return b.new(lib.tb_add_scalar(b.new(lib.tb_neg(b.h)).h, float(a)))
        raise Error("tb_fx: a number divided by a tensor is not lowered")
    return op


def _add_scalar(x, v):
    return x.new(x.g.lib.tb_add_scalar(x.h, v), "tb_add_scalar")


def _mul_scalar(x, v):
    return x.new(x.g.lib.tb_mul_scalar(x.h, v), "tb_mul_scalar")


add = _binary("add", _add_scalar)
mul = _binary("mul", _mul_scalar)
sub = _binary("sub", lambda x, v: _add_scalar(x, -v))
div = _binary("div", lambda x, v: _mul_scalar(x, 1.0 / v))


def reshape(x, *dims):
    if len(dims) == 1 and isinstance(dims[0], (tuple, list, torch.Size)):
        dims = tuple(dims[0])
    return x.new(x.g.lib.tb_reshape(x.h, _ints(dims), len(dims)), "tb_reshape")


def flatten(x, start_dim=0, end_dim=-1):
    n = x.dim()
    s, e = start_dim % n if n else 0, end_dim % n if n else 0
    dims = list(x.shape[:s]) + [-1] + list(x.shape[e + 1:])
    return reshape(x, *dims)


def permute(x, *dims):
    if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
        dims = tuple(dims[0])
    return x.new(x.g.lib.tb_permute(x.h, _ints(dims, ctypes.c_int32), len(dims)), "tb_permute")


def transpose(x, d0, d1):
    return x.new(x.g.lib.tb_transpose(x.h, d0, d1), "tb_transpose")


def cat(tensors, dim=0):
    tensors = list(tensors)
    handles = (_T * len(tensors))(*[t.h for t in tensors])
    return tensors[0].new(tensors[0].g.lib.tb_concat(handles, len(tensors), dim), "tb_concat")


def _reduce(name):
    def op(x, dim=None, keepdim=False, dtype=None):
        if dim is None:
            dim = list(range(x.dim()))
        dims = list(dim) if isinstance(dim, (tuple, list)) else [dim]
        return x.new(getattr(x.g.lib, "tb_" + name)(x.h, _ints(dims, ctypes.c_int32), len(dims),
                                                     keepdim), "tb_" + name)
    return op


def adaptive_avg_pool2d(x, output_size):
    size = [x.shape[-2 + i] if v is None else v for i, v in enumerate(_pair(output_size))]
    return x.new(x.g.lib.tb_adaptive_avg_pool2d(x.h, _ints(size)), "tb_adaptive_avg_pool2d")


def max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False):
    if return_indices:
        raise Error("tb_fx: max_pool2d with return_indices is not lowered")
    stride = kernel_size if stride is None or stride == [] else stride
    return x.new(x.g.lib.tb_max_pool2d(x.h, _ints(_pair(kernel_size)), _ints(_pair(stride)),
                                       _ints(_pair(padding)), _ints(_pair(dilation)),
                                       bool(ceil_mode)), "tb_max_pool2d")


def avg_pool2d(x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    if divisor_override is not None:
        raise Error("tb_fx: avg_pool2d with divisor_override is not lowered")
    stride = kernel_size if stride is None or stride == [] else stride
    return x.new(x.g.lib.tb_avg_pool2d(x.h, _ints(_pair(kernel_size)), _ints(_pair(stride)),
                                       _ints(_pair(padding)), bool(ceil_mode),
                                       bool(count_include_pad)), "tb_avg_pool2d")


def softmax(x, dim=None, _stacklevel=3, dtype=None):
    return x.new(x.g.lib.tb_softmax(x.h, -1 if dim is None else dim), "tb_softmax")


def hardtanh(x, min_val=-1.0, max_val=1.0, inplace=False):
    return x.new(x.g.lib.tb_hardtanh(x.h, min_val, max_val), "tb_hardtanh")


def softplus(x, beta=1.0, threshold=20.0):
    if beta != 1 or threshold != 20:
        raise Error("tb_fx: softplus with beta %s and threshold %s is not lowered (PyTorch's "
                    "defaults, 1 and 20, are)" % (beta, threshold))
    return _unary("softplus")(x)


def clamp(x, min=None, max=None):
    lo = -float("inf") if min is None else float(min)
    hi = float("inf") if max is None else float(max)
    return x.new(x.g.lib.tb_clamp(x.h, lo, hi), "tb_clamp")


def matmul(a, b):
    return a.new(a.g.lib.tb_matmul(a.h, b.h), "tb_matmul")


def identity(x, *args, **kwargs):
    return x


def dropout(x, p=0.5, training=False, inplace=False):
    """Training: the library's dropout (its own random stream, not PyTorch's)."""
    if not training or p == 0:
        return x
    return x.new(x.g.lib.tb_dropout(x.h, p, True), "tb_dropout")


def stochastic_depth(x, p, mode, training=True):
    """torchvision.ops.stochastic_depth: the identity in eval mode (or p 0); in training each
    sample ("row") or the whole batch ("batch") kept with probability 1 - p and scaled by
    1 / (1 - p), its mask the library's dropout of ones (its own random stream)."""
    if mode not in ("row", "batch"):
        raise Error("tb_fx: stochastic_depth mode %r is not lowered" % (mode,))
    if not training or p == 0:
        return x
    shape = _shape(x.dtype, [x.shape[0] if mode == "row" else 1] + [1] * (len(x.shape) - 1))
    ones = x.new(x.g.lib.tb_ones(ctypes.byref(shape), ctypes.byref(x.g.device)), "tb_ones")
    mask = ones.new(x.g.lib.tb_dropout(ones.h, p, True), "tb_dropout")
    return mul(x, mask)


def getattr_(x, name):
    if isinstance(x, Value) and name == "shape":
        return torch.Size(x.shape)
    return getattr(x, name)


def linear(x, weight, bias=None):
    return x.new(x.g.lib.tb_linear(x.h, weight.h, bias.h if bias is not None else None),
                 "tb_linear")


_dropout = dropout  # for the lowerings below whose arguments are called `dropout`


def _pad(x, pads):
    """F.pad's constant mode with zeros; pads in F.pad's order (the last axis first)."""
    if not any(pads):
        return x
    return x.new(x.g.lib.tb_pad(x.h, _ints(pads), len(pads), 0.0), "tb_pad")


def _roll(x, shift, dim):
    """torch.roll along one dim: the last shift (mod the size) elements moved to the front."""
    n = x.shape[dim]
    s = shift % n
    if s == 0:
        return x
    lib = x.g.lib
    tail = x.new(lib.tb_slice(x.h, dim, n - s, n, 1), "tb_slice")
    head = x.new(lib.tb_slice(x.h, dim, 0, n - s, 1), "tb_slice")
    return cat([tail, head], dim)


def _normalize(x):
    """F.normalize(x, dim=-1): x over its L2 norm along the last axis, at least 1e-12."""
    norm = _unary("sqrt")(_reduce("sum")(mul(x, x), -1, True))
    return div(x, clamp(norm, min=1e-12))


def patch_merging_pad(x):
    """torchvision's Swin _patch_merging_pad: [..., H, W, C] -> [..., H/2, W/2, 4C] (the
    even-even, odd-even, even-odd and odd-odd positions side by side), an odd side padded
    with zeros first."""
    h, w = x.shape[-3], x.shape[-2]
    x = _pad(x, [0, 0, 0, w % 2, 0, h % 2])
    parts = [x[..., a::2, b::2, :] for a, b in ((0, 0), (1, 0), (0, 1), (1, 1))]
    return cat(parts, len(x.shape) - 1)


def relative_position_bias(table, index, window_size):
    """torchvision's Swin _get_relative_position_bias: the table's rows picked by the index,
    as [1, heads, N, N] for a window of N positions."""
    n = window_size[0] * window_size[1]
    return unsqueeze(permute(reshape(table[index], [n, n, -1]), 2, 0, 1), 0)


def _shift_mask(ph, pw, wh, ww, sh, sw, dtype):
    """Swin's attention mask of shifted windows, as torchvision makes it: [windows, N, N], 0
    between positions of one region of the shifted map and -100 between others."""
    m = torch.zeros(ph, pw, dtype=dtype)
    count = 0
    for h in ((0, -wh), (-wh, -sh), (-sh, None)):
        for w in ((0, -ww), (-ww, -sw), (-sw, None)):
            m[h[0]:h[1], w[0]:w[1]] = count
            count += 1
    m = m.view(ph // wh, wh, pw // ww, ww).permute(0, 2, 1, 3).reshape(-1, wh * ww)
    m = m.unsqueeze(1) - m.unsqueeze(2)
    return m.masked_fill(m != 0, -100.0)


def shifted_window_attention(x, qkv_weight, proj_weight, relative_position_bias, window_size,
                             num_heads, shift_size, attention_dropout=0.0, dropout=0.0,
                             qkv_bias=None, proj_bias=None, logit_scale=None):
    """torchvision's shifted_window_attention (Swin, and Swin V2's cosine attention with
    logit_scale), op for op: padding to whole windows, the cyclic shift as two slices and a
    cat per axis, the windows as a reshape and a permute, attention with the relative position
    bias and the shifted windows' mask (a constant of the sizes, made once), and back."""
    b, h, w, c = x.shape
    wh, ww = window_size
    pad_r, pad_b = (ww - w % ww) % ww, (wh - h % wh) % wh
    x = _pad(x, [0, 0, 0, pad_r, 0, pad_b])
    ph, pw = h + pad_b, w + pad_r
    sh = 0 if wh >= ph else shift_size[0]
    sw = 0 if ww >= pw else shift_size[1]
    shifted = sh + sw > 0
    if shifted:
        x = _roll(_roll(x, -sh, 1), -sw, 2)
    nw, n = (ph // wh) * (pw // ww), wh * ww
    x = reshape(permute(reshape(x, [b, ph // wh, wh, pw // ww, ww, c]), 0, 1, 3, 2, 4, 5),
                [b * nw, n, c])
    if logit_scale is not None and qkv_bias is not None:  # V2: the keys' third of it is 0
        third = qkv_bias.shape[0] // 3
        qkv_bias = cat([qkv_bias[:third], _mul_scalar(qkv_bias[third:2 * third], 0.0),
                        qkv_bias[2 * third:]], 0)
    qkv = reshape(linear(x, qkv_weight, qkv_bias), [b * nw, n, 3, num_heads, c // num_heads])
    qkv = permute(qkv, 2, 0, 3, 1, 4)
    q, k, v = qkv[0], qkv[1], qkv[2]
    if logit_scale is not None:
        attn = matmul(_normalize(q), transpose(_normalize(k), -2, -1))
        attn = mul(attn, _unary("exp")(clamp(logit_scale, max=math.log(100.0))))
    else:
        attn = matmul(_mul_scalar(q, (c // num_heads) ** -0.5), transpose(k, -2, -1))
    attn = add(attn, relative_position_bias)
    if shifted:
        mask = x.g.constant(("swin_mask", ph, pw, wh, ww, sh, sw, x.dtype),
                            lambda: _shift_mask(ph, pw, wh, ww, sh, sw, x.dtype))
        attn = add(reshape(attn, [b, nw, num_heads, n, n]), reshape(mask, [1, nw, 1, n, n]))
        attn = reshape(attn, [b * nw, num_heads, n, n])
    attn = _dropout(softmax(attn, -1), attention_dropout, True)  # F.dropout's default
    x = reshape(transpose(matmul(attn, v), 1, 2), [b * nw, n, c])
    x = _dropout(linear(x, proj_weight, proj_bias), dropout, True)
    x = reshape(permute(reshape(x, [b, ph // wh, pw // ww, wh, ww, c]), 0, 1, 3, 2, 4, 5),
                [b, ph, pw, c])
    if shifted:
        x = _roll(_roll(x, sh, 1), sw, 2)
    return x[:, :h, :w, :]


def _conv_padding(padding, kernel, dilation):
    """A convolution's padding per side: "valid" none, "same" (stride 1) dilation * (k - 1) / 2
    (odd kernels), else the numbers given."""
    if not isinstance(padding, str):
        return _pair(padding)
    d = _pair(dilation)
    return [0, 0] if padding == "valid" else [d[i] * (kernel[i] - 1) // 2 for i in range(2)]


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    padding = _conv_padding(padding, weight.shape[-2:], dilation)
    return x.new(x.g.lib.tb_conv2d(x.h, weight.h, bias.h if bias is not None else None,
                                   _ints(_pair(stride)), _ints(_pair(padding)),
                                   _ints(_pair(dilation)), groups), "tb_conv2d")


def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    n = len(normalized_shape) if isinstance(normalized_shape, (tuple, list)) else 1
    return x.new(x.g.lib.tb_layer_norm(x.h, n, weight.h if weight is not None else None,
                                       bias.h if bias is not None else None, eps),
                 "tb_layer_norm")


# ---- modules ----

def _conv2d(g, path, m, x):
    if m.padding_mode != "zeros":
        raise Error("tb_fx: %s: padding_mode %r is not lowered" % (path, m.padding_mode))
    padding = _conv_padding(m.padding, m.kernel_size, m.dilation)
    if path in g.folded:
        w, b = g.folded[path]
    else:
        w, b = g.param(path, "weight"), g.param(path, "bias")
    return x.new(g.lib.tb_conv2d(x.h, w, b, _ints(m.stride), _ints(padding), _ints(m.dilation),
                                 m.groups), "tb_conv2d (%s)" % path)


def _batch_norm(g, path, m, x):
    training = m.training or m.running_mean is None
    if training and not g.training:
        raise Error("tb_fx: %s: batch norm in training mode inside a graph compiled for "
                    "inference" % path)
    if training and m.momentum is None:
        raise Error("tb_fx: %s: batch norm with momentum=None (a cumulative average) is not "
                    "lowered" % path)
    return x.new(g.lib.tb_batch_norm(x.h, g.param(path, "running_mean"),
                                     g.param(path, "running_var"), g.param(path, "weight"),
                                     g.param(path, "bias"), training,
                                     m.momentum if m.momentum is not None else 0.1, m.eps),
                 "tb_batch_norm (%s)" % path)


def _linear(g, path, m, x):
    return x.new(g.lib.tb_linear(x.h, g.param(path, "weight"), g.param(path, "bias")),
                 "tb_linear (%s)" % path)


def _layer_norm(g, path, m, x):
    return x.new(g.lib.tb_layer_norm(x.h, len(m.normalized_shape), g.param(path, "weight"),
                                     g.param(path, "bias"), m.eps), "tb_layer_norm (%s)" % path)


def _activation(a, path):
    """A transformer layer's activation (a function, a module or its name) as a lowering."""
    name = a if isinstance(a, str) else getattr(a, "__name__", type(a).__name__).lower()
    if name not in ("relu", "gelu"):
        raise Error("tb_fx: %s: activation %r is not lowered" % (path, a))
    return _unary(name)


def _attention(g, path, m, query, key, value, key_padding_mask=None, need_weights=True,
               attn_mask=None, average_attn_weights=True, is_causal=False):
    """nn.MultiheadAttention (one in_proj, batch_first or not): the projections as linears,
    the heads as a dim, the attention as the library's scaled dot-product attention (need_weights
    False) or as softmax(q k^T / sqrt(d) + mask) and its matmul (the weights returned, averaged
    over the heads or not). Masks: an additive float or a bool attn_mask of [L, S] or
    [N * H, L, S]; key_padding_mask is not lowered."""
    if m.in_proj_weight is None or m.bias_k is not None or m.add_zero_attn:
        raise Error("tb_fx: %s: multi-head attention with separate projections, bias_k or "
                    "add_zero_attn is not lowered" % path)
    if key_padding_mask is not None:
        raise Error("tb_fx: %s: key_padding_mask is not lowered" % path)
    q, k, v = query, key, value
    if not m.batch_first:
        q, k, v = (transpose(t, 0, 1) for t in (q, k, v))
    e, h = m.embed_dim, m.num_heads
    w, b = g.param(path, "in_proj_weight"), g.param(path, "in_proj_bias")
    if q is k and k is v:  # self-attention: one projection, cut in three
        q, k, v = chunk(q.new(g.lib.tb_linear(q.h, w, b), "tb_linear (%s)" % path), 3, -1)
    else:
        ws = [q.new(g.lib.tb_slice(w, 0, i * e, (i + 1) * e, 1), "tb_slice") for i in range(3)]
        bs = [q.new(g.lib.tb_slice(b, 0, i * e, (i + 1) * e, 1), "tb_slice") if b else None
              for i in range(3)]
        q, k, v = (t.new(g.lib.tb_linear(t.h, ws[i].h, bs[i].h if bs[i] else None),
                         "tb_linear (%s)" % path) for i, t in enumerate((q, k, v)))

    def heads(t):  # [N, L, E] -> [N, H, L, E / H]
        return permute(reshape(t, t.shape[0], t.shape[1], h, e // h), 0, 2, 1, 3)

    q, k, v = heads(q), heads(k), heads(v)
    mask = None
    if attn_mask is not None:
        mask = attn_mask if attn_mask.dim() == 2 else reshape(
            attn_mask, q.shape[0], h, attn_mask.shape[-2], attn_mask.shape[-1])
    p = m.dropout if m.training else 0.0
    weights = None
    if need_weights:
        scores = mul(matmul(q, transpose(k, -2, -1)), (e // h) ** -0.5)
        if mask is not None and mask.dtype == torch.bool:
            raise Error("tb_fx: %s: a bool attn_mask with need_weights=True is not lowered" %
                        path)
        weights = softmax(add(scores, mask) if mask is not None else scores, -1)
        out = matmul(dropout(weights, p, m.training), v)
        if average_attn_weights:
            weights = _reduce("mean")(weights, 1)
    else:
        out = q.new(g.lib.tb_scaled_dot_product_attention(
            q.h, k.h, v.h, mask.h if mask is not None else None, p, bool(is_causal), 0.0),
            "tb_scaled_dot_product_attention (%s)" % path)
    out = permute(out, 0, 2, 1, 3)
    out = reshape(out, out.shape[0], out.shape[1], e)
    out = out.new(g.lib.tb_linear(out.h, g.param(path + ".out_proj", "weight"),
                                  g.param(path + ".out_proj", "bias")), "tb_linear (%s)" % path)
    if not m.batch_first:
        out = transpose(out, 0, 1)
    return out, weights


def _encoder_layer(g, path, m, x, src_mask=None, src_key_padding_mask=None, is_causal=False):
    """nn.TransformerEncoderLayer (post-norm or norm_first), from its submodules."""
    def sa(t):
        y, _ = _attention(g, path + ".self_attn", m.self_attn, t, t, t, src_key_padding_mask,
                          False, src_mask, True, is_causal)
        return dropout(y, m.dropout1.p, m.training)

    def ff(t):
        t = _linear(g, path + ".linear1", m.linear1, t)
        t = dropout(_activation(m.activation, path)(t), m.dropout.p, m.training)
        return dropout(_linear(g, path + ".linear2", m.linear2, t), m.dropout2.p, m.training)

    n1 = lambda t: _layer_norm(g, path + ".norm1", m.norm1, t)  # noqa: E731
    n2 = lambda t: _layer_norm(g, path + ".norm2", m.norm2, t)  # noqa: E731
    if m.norm_first:
        x = add(x, sa(n1(x)))
        return add(x, ff(n2(x)))
    x = n1(add(x, sa(x)))
    return n2(add(x, ff(x)))


def _encoder(g, path, m, x, mask=None, src_key_padding_mask=None, is_causal=None):
    """nn.TransformerEncoder: its layers in turn, then its norm."""
    for i, layer in enumerate(m.layers):
        x = _encoder_layer(g, "%s.layers.%d" % (path, i), layer, x, mask, src_key_padding_mask,
                           bool(is_causal))
    return _layer_norm(g, path + ".norm", m.norm, x) if m.norm is not None else x


MODULES = {
    nn.Conv2d: _conv2d,
    nn.BatchNorm2d: _batch_norm,
    nn.Linear: _linear,
    nn.LayerNorm: _layer_norm,
    nn.ReLU: lambda g, p, m, x: _unary("relu")(x),
    nn.ReLU6: lambda g, p, m, x: _unary("relu6")(x),
    nn.Hardtanh: lambda g, p, m, x: hardtanh(x, m.min_val, m.max_val),
    nn.Hardswish: lambda g, p, m, x: _unary("hardswish")(x),
    nn.Hardsigmoid: lambda g, p, m, x: _unary("hardsigmoid")(x),
    nn.Sigmoid: lambda g, p, m, x: _unary("sigmoid")(x),
    nn.Tanh: lambda g, p, m, x: _unary("tanh")(x),
    nn.GELU: lambda g, p, m, x: _unary("gelu")(x),
    nn.SiLU: lambda g, p, m, x: _unary("silu")(x),
    nn.Mish: lambda g, p, m, x: _unary("mish")(x),
    nn.Softplus: lambda g, p, m, x: softplus(x, m.beta, m.threshold),
    nn.MaxPool2d: lambda g, p, m, x: max_pool2d(x, m.kernel_size, m.stride, m.padding, m.dilation,
                                                m.ceil_mode, m.return_indices),
    nn.AvgPool2d: lambda g, p, m, x: avg_pool2d(x, m.kernel_size, m.stride, m.padding,
                                                m.ceil_mode, m.count_include_pad,
                                                m.divisor_override),
    nn.AdaptiveAvgPool2d: lambda g, p, m, x: adaptive_avg_pool2d(x, m.output_size),
    nn.Flatten: lambda g, p, m, x: flatten(x, m.start_dim, m.end_dim),
    nn.Dropout: lambda g, p, m, x: dropout(x, m.p, m.training),
    nn.Identity: lambda g, p, m, x: x,
    nn.Softmax: lambda g, p, m, x: softmax(x, m.dim),
    nn.MultiheadAttention: _attention,
    nn.TransformerEncoderLayer: _encoder_layer,
    nn.TransformerEncoder: _encoder,
}

# modules traced as one node and lowered whole (their forward branches on tensor attributes,
# which torch.fx cannot trace)
LEAVES = (nn.MultiheadAttention, nn.TransformerEncoderLayer, nn.TransformerEncoder)


def _unpacked(frame):
    """How many values the instruction `frame` is executing unpacks (UNPACK_SEQUENCE), or None.
    Found by the instruction's offset: torch.fx's own lookup (f_lasti // 2 as an index into
    the instructions) misses on Python >= 3.11, where instructions carry inline caches."""
    for inst in dis.get_instructions(frame.f_code):
        if inst.offset == frame.f_lasti:
            return inst.argval if inst.opname == "UNPACK_SEQUENCE" else None
    return None


class _Proxy(torch.fx.Proxy):
    """fx's Proxy whose unpacking (`n, c, h, w = x.shape`) works on every Python."""

    def __iter__(self):
        n = _unpacked(inspect.currentframe().f_back)
        if n is None:
            return self.tracer.iter(self)
        return (self[i] for i in range(n))

    def __getattr__(self, k):
        return _Attribute(self, k)


class _Attribute(torch.fx.proxy.Attribute, _Proxy):
    pass


class _Tracer(torch.fx.Tracer):
    def is_leaf_module(self, m, qualname):
        return isinstance(m, LEAVES) or super().is_leaf_module(m, qualname)

    def proxy(self, node):
        return _Proxy(node, self)


def _trace(model, num_inputs):
    """model as a GraphModule: torch.fx's symbolic tracing, the modules of LEAVES kept whole
    (one of them as the model itself: a graph of one call of it, on num_inputs inputs)."""
    if isinstance(model, LEAVES):
        graph = torch.fx.Graph()
        inputs = [graph.placeholder("input%d" % i) for i in range(num_inputs)]
        graph.output(graph.call_module("model", tuple(inputs)))
        holder = nn.Module()
        holder.model = model
        holder.train(model.training)
        return torch.fx.GraphModule(holder, graph, type(model).__name__)
    graph = _Tracer().trace(model)
    return torch.fx.GraphModule(model, graph, type(model).__name__)


def chunk(x, chunks, dim=0):
    """torch.chunk: pieces of ceil(size / chunks) along dim (the last may be smaller)."""
    n = x.shape[dim]
    step = -(-n // chunks)
    return tuple(x.new(x.g.lib.tb_slice(x.h, dim, i, min(i + step, n), 1), "tb_slice")
                 for i in range(0, n, step))


def expand(x, *dims):
    if len(dims) == 1 and isinstance(dims[0], (tuple, list, torch.Size)):
        dims = tuple(dims[0])
    return x.new(x.g.lib.tb_expand(x.h, _ints(dims), len(dims)), "tb_expand")


def unsqueeze(x, dim):
    shape = list(x.shape)
    shape.insert(dim if dim >= 0 else len(shape) + 1 + dim, 1)
    return reshape(x, shape)


def einsum(equation, *operands):
    """torch.einsum of one or two operands (no ellipsis, no repeated letter in one operand):
    letters only in one operand and not in the output summed first, then one batched matmul
    (batch letters: in both and the output; contracted: in both, not the output) and a
    permute to the output's order."""
    if len(operands) == 1 and isinstance(operands[0], (tuple, list)):
        operands = tuple(operands[0])
    eq = equation.replace(" ", "")
    if "->" not in eq or "." in eq or not 1 <= len(operands) <= 2:
        raise Error("tb_fx: einsum %r is not lowered (one or two operands, an explicit "
                    "output, no ellipsis)" % equation)
    ins, out = eq.split("->")
    ins = ins.split(",")
    if any(len(set(t)) != len(t) for t in ins) or len(ins) != len(operands):
        raise Error("tb_fx: einsum %r is not lowered" % equation)
    ops = list(operands)
    for i, t in enumerate(ins):  # letters nobody else has: summed away
        other = "".join(ins[:i] + ins[i + 1:]) + out
        gone = [d for d, c in enumerate(t) if c not in other]
        if gone:
            ops[i] = _reduce("sum")(ops[i], gone)
            ins[i] = "".join(c for c in t if c in other)
    if len(ops) == 1:
        return permute(ops[0], [ins[0].index(c) for c in out])
    (a, b), (ta, tb) = ops, ins
    batch = [c for c in ta if c in tb and c in out]
    contr = [c for c in ta if c in tb and c not in out]
    left = [c for c in ta if c not in tb]
    right = [c for c in tb if c not in ta]
    size = dict(zip(ta, a.shape))
    size.update(zip(tb, b.shape))

    def prod(cs):
        n = 1
        for c in cs:
            n *= size[c]
        return n

    a = reshape(permute(a, [ta.index(c) for c in batch + left + contr]),
                prod(batch), prod(left), prod(contr))
    b = reshape(permute(b, [tb.index(c) for c in batch + contr + right]),
                prod(batch), prod(contr), prod(right))
    y = reshape(matmul(a, b), [size[c] for c in batch + left + right])
    order = batch + left + right
    return permute(y, [order.index(c) for c in out])


def _on_numbers(op):
    """A Python operator on the numbers and shapes a graph computes (sizes, indices), not on
    tensors."""
    def run(*args):
        if any(isinstance(a, Value) for a in args):
            raise Error("tb_fx: %s of a tensor is not lowered" % _target_name(op))
        return op(*args)
    return run


def _assert(condition, message=""):
    """torch._assert on what the graph knows at the call (sizes)."""
    if isinstance(condition, Value):
        raise Error("tb_fx: torch._assert on a tensor is not lowered")
    if not condition:
        raise Error("tb_fx: the model's assertion failed: %s" % message)


FUNCTIONS = {
    operator.add: add, torch.add: add, operator.iadd: add,
    operator.mul: mul, torch.mul: mul, operator.imul: mul,
    operator.sub: sub, torch.sub: sub,
    operator.truediv: div, torch.div: div,
    operator.getitem: lambda a, i: a[i],
    F.linear: linear, F.conv2d: conv2d, F.layer_norm: layer_norm,
    getattr: getattr_,
    torch.flatten: flatten, torch.reshape: reshape, torch.cat: cat, torch.concat: cat,
    torch.permute: permute, torch.transpose: transpose, torch.matmul: matmul,
    torch.relu: _unary("relu"), F.relu: _unary("relu"), F.relu6: _unary("relu6"),
    torch.sigmoid: _unary("sigmoid"), torch.tanh: _unary("tanh"), F.gelu: _unary("gelu"),
    F.silu: _unary("silu"), F.hardswish: _unary("hardswish"), F.mish: _unary("mish"),
    F.softplus: softplus,
    F.hardsigmoid: _unary("hardsigmoid"), F.hardtanh: hardtanh, torch.clamp: clamp,
    F.adaptive_avg_pool2d: adaptive_avg_pool2d, F.max_pool2d: max_pool2d,
    F.avg_pool2d: avg_pool2d, F.dropout: dropout, F.softmax: softmax, torch.softmax: softmax,
    torch.mean: _reduce("mean"), torch.sum: _reduce("sum"),
    torch.chunk: chunk, torch.einsum: einsum, torch.unsqueeze: unsqueeze,
    torch.swapaxes: transpose, torch._assert: _assert,
}
# Python's operators on sizes (the arithmetic ones above take sizes too)
FUNCTIONS.update({op: _on_numbers(op) for op in (
    operator.floordiv, operator.mod, operator.eq, operator.ne, operator.lt, operator.le,
    operator.gt, operator.ge, operator.neg)})

# functions of other packages, by module and name (this module does not import them)
FUNCTIONS_BY_NAME = {
    "torchvision.ops.stochastic_depth.stochastic_depth": stochastic_depth,
    "torchvision.models.swin_transformer.shifted_window_attention": shifted_window_attention,
    "torchvision.models.swin_transformer._patch_merging_pad": patch_merging_pad,
    "torchvision.models.swin_transformer._get_relative_position_bias": relative_position_bias,
}


def _function(target):
    """The lowering of a call_function target, or None."""
    try:
        if target in FUNCTIONS:
            return FUNCTIONS[target]
    except TypeError:  # an unhashable target
        return None
    return FUNCTIONS_BY_NAME.get("%s.%s" % (getattr(target, "__module__", ""),
                                            getattr(target, "__qualname__", "")))


METHODS = {
    "chunk": chunk, "expand": expand, "unsqueeze": unsqueeze, "swapaxes": transpose,
    "view": reshape, "reshape": reshape, "flatten": flatten, "permute": permute,
    "transpose": transpose, "contiguous": identity, "size": lambda x, d=None: x.size(d),
    "dim": lambda x: x.dim(), "mean": _reduce("mean"), "sum": _reduce("sum"),
    "relu": _unary("relu"), "sigmoid": _unary("sigmoid"), "softmax": softmax,
    "add": add, "mul": mul, "sub": sub, "div": div, "clamp": clamp, "matmul": matmul,
}


class _Train(torch.autograd.Function):
    """The library's forward as one autograd node: backward runs tb_grad on the recorded graph
    for the inputs and parameters that require grad."""

    @staticmethod
    def forward(ctx, graph, n_inputs, *tensors):
        inputs, params = tensors[:n_inputs], tensors[n_inputs:]
        ctx.wanted = [i for i, t in enumerate(tensors)
                      if isinstance(t, torch.Tensor) and t.requires_grad]
        out, state = graph.run(inputs, params, ctx.wanted)
        ctx.graph, ctx.state = graph, state
        ctx.n = len(tensors)
        ctx.handles = state["wanted"]
        outs = out if isinstance(out, tuple) else (out,)
        ctx.single = not isinstance(out, tuple)
        return outs if not ctx.single else outs[0]

    @staticmethod
    def backward(ctx, *grad_outputs):
        if not ctx.state["keep"]:
            raise Error("tb_fx: a second backward through one call (retain_graph=True) is not "
                        "supported: the call's tensors went with the first")
        try:
            grads = ctx.graph.grads(ctx.state, grad_outputs, ctx.handles)
        finally:
            ctx.graph.release_state(ctx.state)
        full = [None] * ctx.n
        for i, g in zip(ctx.wanted, grads):
            full[i] = g
        return (None, None) + tuple(full)


class Compiled:
    """The callable compile() returns: runs the graph on the library for each call. A module
    compiled in training mode gives outputs that backward() differentiates through the
    library (tb_grad), the gradients landing in the module's parameters as PyTorch's would."""

    def __init__(self, gm, example_inputs, device, strict):
        self.graph = _Graph(gm, device, strict)  # shapes come from each call's inputs
        self.fallback = list(self.graph.fallback)
        self.training = self.graph.training
        if self.training and self.fallback:
            raise Error("tb_fx: training needs every node lowered; these are not: %s" %
                        ", ".join(self.fallback))

    def __call__(self, *inputs):
        if not self.training:
            switched = self.graph.mode()
            if switched:
                raise Error("tb_fx: %s is in training mode now, but the graph was compiled for "
                            "inference: compile it again" % (switched[0] or "the model"))
            return self.graph.run(inputs)
        g = self.graph
        if not torch.is_grad_enabled():  # no backward can follow: nothing to keep for one
            out, state = g.run(inputs, g.param_values())
            g.release_state(state)
            return out
        return _Train.apply(g, len(inputs), *inputs, *g.param_values())


def compile(model, example_inputs=(), device="opencl:0", strict=False):
    """model (an nn.Module or fx.GraphModule) as a callable that runs on the library's `device`
    ("opencl:0", "native:0", "cpu:0", ...); dynamo's CompilerFn signature."""
    gm = (model if isinstance(model, torch.fx.GraphModule) else
          _trace(model, len(list(example_inputs))))
    return Compiled(gm, list(example_inputs), device, strict)


try:  # PyTorch >= 2: torch.compile(model, backend="torch_backend")
    from torch._dynamo import register_backend as _register

    _register(compiler_fn=compile, name="torch_backend")
except Exception:  # noqa: BLE001 (no dynamo: PyTorch 1.13 has none, nothing to register)
    pass
