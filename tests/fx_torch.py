"""tools/tb_fx.py against PyTorch: torchvision models and small modules traced with torch.fx,
compiled onto the library's devices (cpu, native, opencl where they exist), their outputs
within 1e-5 of PyTorch's relative to the output's scale, a second call the same (replaying
the first's library calls), inputs of two shapes in turn, parameters left on the device; a
training step of ResNet-18 (gradients of every parameter and the input, running statistics,
an optimizer step); a node without a lowering run in PyTorch (and an error
with strict=True); bad arguments as errors with the library's message.

    /usr/bin/python3 tests/fx_torch.py [--quick] [--devices cpu,native,opencl]

Prints one line per check ("ok ..." or "FAIL ...") and last "N passed, N failed"; exit status 1
on a failure, 0 (with "skipped: ...") when torch or torchvision cannot be imported.
"""
import argparse
import copy
import ctypes
import gc
import os
import sys
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tools"))
try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    import torchvision
except Exception as e:  # noqa: BLE001 (any failure to import: nothing to compare with)
    print("skipped: torch or torchvision cannot be imported: %s" % e)
    print("0 passed, 0 failed")
    sys.exit(0)
import tb_fx

RESULTS = {"passed": 0, "failed": 0}


def check(ok, what):
    RESULTS["passed" if ok else "failed"] += 1
    print(("ok " if ok else "FAIL ") + what, flush=True)
    return ok


def rel_err(got, want):
    scale = want.abs().max().item() or 1.0
    return (got - want).abs().max().item() / scale


def worst_grad(ours, ref, xo, xr):
    """The largest error / scale of a gradient of ours (parameters, then the input xo) against
    ref's (xr), and whose it is; inf where ours has none."""
    worst, where = 0.0, "-"
    pairs = list(zip(ours.named_parameters(), ref.named_parameters()))
    pairs.append((("input", xo), ("input", xr)))
    for (name, a), (_, b) in pairs:
        e = rel_err(a.grad, b.grad) if a.grad is not None else float("inf")
        if e > worst:
            worst, where = e, name
    return worst, where


class Small(nn.Module):
    """Functions and methods fx records as call_function/call_method nodes."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(12, 6)
        self.norm = nn.LayerNorm(6)
        self.mish = nn.Mish()
        self.register_buffer("offset", torch.linspace(-1, 1, 6))

    def forward(self, x, y):
        n = x.size(0)
        h = torch.cat([x, y * 2.0], dim=1)            # [n, 12]
        h = self.norm(F.gelu(self.fc(h))) + self.offset
        h = h.view(n, 2, 3).permute(0, 2, 1).contiguous()
        h = torch.flatten(h.transpose(1, 2), 1) - 0.5
        s = torch.softmax(h, dim=-1) + h.mean(dim=1, keepdim=True)
        return F.relu6(s * 3.0), torch.sigmoid(h).sum(1) + (self.mish(h) * F.softplus(h)).mean(1)


class Indexing(nn.Module):
    """Shapes unpacked, sizes computed, chunk, einsum, a gather by an index tensor, basic
    indexing, unsqueeze, expand and swapaxes."""

    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.randn(10, 3))
        self.register_buffer("index", torch.tensor([[1, 4], [9, 0]]))

    def forward(self, x, y):
        n, c, length = x.shape
        torch._assert(c % 2 == 0, "an even number of channels")
        a, b = x.chunk(2, dim=1)
        e = torch.einsum("n c l, n d l -> n c d", a, b) / (length // 2)
        z = x[:, 0, 1:] - x[..., -1][:, None, 1]
        u = torch.unsqueeze(z, 1).expand(n, 2, length - 1)
        return e, self.table[self.index], u, torch.swapaxes(y, 1, 2)[None]


class WithFallback(nn.Module):
    def forward(self, x):
        return torch.cumsum(torch.relu(x), dim=1) + 1.0


def run_case(name, model, inputs, device, tol=1e-5):
    # new values of the same signature for a third call: the replay computes from them
    others = [t * 0.75 - 0.125 if isinstance(t, torch.Tensor) and t.is_floating_point() else t
              for t in inputs]
    with torch.no_grad():
        want = model(*inputs)
        want_other = model(*others)
    try:
        f = tb_fx.compile(model, inputs, device=device)
        got = f(*inputs)
        again = f(*inputs)
        other = f(*others)
    except tb_fx.Error as e:
        return check(False, "%s on %s: %s" % (name, device, e))
    wants = want if isinstance(want, tuple) else (want,)
    gots = got if isinstance(got, tuple) else (got,)
    agains = again if isinstance(again, tuple) else (again,)
    errs = [rel_err(g, w) for g, w in zip(gots, wants)]
    errs += [rel_err(g, w) for g, w in zip(other if isinstance(other, tuple) else (other,),
                                           want_other if isinstance(want_other, tuple) else
                                           (want_other,))]
    same = all(torch.equal(a, g) for a, g in zip(agains, gots))
    shapes = all(g.shape == w.shape and g.dtype == w.dtype for g, w in zip(gots, wants))
    # the second call replays the first's library calls (no walk over the graph)
    replayed = len(f.graph.tapes) == 1 and None not in f.graph.tapes.values()
    return check(len(gots) == len(wants) and shapes and max(errs) <= tol and same and
                 not f.fallback and replayed,
                 "%s on %s: error / output scale %s, second call %s%s, fallback %s" % (
                     name, device, " ".join("%.1e" % e for e in errs),
                     "the same" if same else "DIFFERENT",
                     " (replayed)" if replayed else " (NOT replayed)", f.fallback or "none"))


def replays(device):
    """Calls with inputs of another shape record a tape of their own; each replay computes
    from its own inputs (new values, the shapes taking turns)."""
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(12, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 4)).eval()
    f = tb_fx.compile(model, [torch.randn(3, 12)], device=device)
    worst = 0.0
    for i in range(6):
        x = torch.randn(3 if i % 2 == 0 else 5, 12)
        with torch.no_grad():
            want = model(x)
        worst = max(worst, rel_err(f(x), want))
    tapes = list(f.graph.tapes.values())
    return check(worst <= 1e-5 and len(tapes) == 2 and None not in tapes,
                 "replays on %s: inputs of two shapes in turn, %d tapes, worst error / output "
                 "scale %.1e" % (device, len(f.graph.tapes), worst))


class Passthrough(nn.Module):
    """Outputs that are an input and a parameter themselves, beside a computed one."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.tensor([0.5, -2.0, 3.0]))

    def forward(self, x):
        return x * self.scale, x, self.scale


def passthrough(device):
    """A graph the library cannot record as a function (an output is an input): each call walks
    it, the first refusal remembered, and the parameter output stays the graph's own."""
    model = Passthrough().eval()
    f = tb_fx.compile(model, [torch.randn(4, 3)], device=device)
    worst = 0.0
    for i in range(4):
        x = torch.randn(4, 3)
        with torch.no_grad():
            want = model(x)
        got = f(x)
        worst = max([worst] + [rel_err(g, w) for g, w in zip(got, want)])
    tapes = list(f.graph.tapes.values())
    return check(worst <= 1e-6 and tapes == [None],
                 "outputs that are an input and a parameter on %s: 4 calls, worst error / output "
                 "scale %.1e, recorded as a function: %s" % (
                     device, worst, "no (walked each call)" if tapes == [None] else tapes))


class Attention(nn.Module):
    """nn.MultiheadAttention on its own (sequence first), weights returned."""

    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 2)

    def forward(self, q, k):
        r = self.attn(q, k, k)
        return r[0], r[1]


class Depth(nn.Module):
    """torchvision's stochastic depth around a linear layer."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.drop = torchvision.ops.StochasticDepth(0.5, "row")

    def forward(self, x):
        return x + self.drop(self.fc(x))


def encoder(norm_first):
    """A TransformerEncoder (two layers, no dropout): post-norm ReLU batch-first, or norm_first
    GELU sequence-first with a final norm."""
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=not norm_first,
                                       norm_first=norm_first,
                                       activation="gelu" if norm_first else "relu")
    return nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(32) if norm_first else None,
                                 enable_nested_tensor=False)


def projected_step(name, ref, x, g, device):
    """A training step of `ref` (a module in training mode) and of its copy compiled on
    `device`, the loss the output's projection on g (the mean of its squares would be near
    constant through a final layer norm: a gradient of cancellations, ill-conditioned in
    float32): every parameter's gradient and the input's within 1e-4 of PyTorch's scale."""
    ours = copy.deepcopy(ref)
    xr, xo = x.clone().requires_grad_(), x.clone().requires_grad_()
    (ref(xr) * g).sum().backward()
    f = tb_fx.compile(ours, [xo], device=device)
    (f(xo) * g).sum().backward()
    worst, where = worst_grad(ours, ref, xo, xr)
    return check(worst <= 1e-4, "a training step of %s on %s: gradients within %.1e of "
                 "PyTorch's scale (worst: %s)" % (name, device, worst, where))


def transformer(device):
    """Encoders and attention lowered whole (their forward branches on tensor attributes):
    values, and one training step's gradients of an encoder against PyTorch's."""
    for norm_first in (False, True):
        torch.manual_seed(3)
        run_case("TransformerEncoder (%s)" % ("norm_first, GELU, sequence first" if norm_first
                                               else "post-norm, ReLU, batch first"),
                 encoder(norm_first).eval(), [torch.randn(3, 5, 32)], device)
    torch.manual_seed(3)
    run_case("MultiheadAttention with its weights", Attention().eval(),
             [torch.randn(4, 2, 16), torch.randn(6, 2, 16)], device)
    torch.manual_seed(4)
    projected_step("a TransformerEncoder", encoder(True).train(), torch.randn(6, 2, 32),
                   torch.randn(6, 2, 32), device)
    # stochastic depth: the identity in eval; in training each row kept (scaled by 2) or not
    torch.manual_seed(5)
    m = Depth()
    x = torch.randn(64, 8)
    run_case("stochastic depth in eval mode", m.eval(), [x], device)
    m.train()
    f = tb_fx.compile(m, [x], device=device)
    with torch.no_grad():
        branch = m.fc(x)
        got = f(x) - x
    kept = [torch.allclose(r, 2 * b, rtol=1e-5, atol=1e-5) for r, b in zip(got, branch)]
    dropped = [bool((r.abs() <= 1e-6).all()) for r in got]
    rows = sum(kept)
    check(all(k or d for k, d in zip(kept, dropped)) and 10 <= rows <= 54,
          "stochastic depth in training on %s: each of 64 rows kept (x2) or dropped whole, "
          "%d kept" % (device, rows))


class SwinStage(nn.Module):
    """torchvision's Swin blocks (V1, or V2 with cosine attention and its position-bias MLP):
    one without and one with the cyclic shift, on a map whose sides are not whole windows
    (padded), then the patch merging of odd sides (padded too)."""

    def __init__(self, v2):
        super().__init__()
        sw = torchvision.models.swin_transformer
        block = sw.SwinTransformerBlockV2 if v2 else sw.SwinTransformerBlock
        self.blocks = nn.Sequential(block(32, 2, [4, 4], [0, 0]), block(32, 2, [4, 4], [2, 2]))
        self.merge = (sw.PatchMergingV2 if v2 else sw.PatchMerging)(32)

    def forward(self, x):
        return self.merge(self.blocks(x))


def swin(device):
    """Swin's shifted-window attention, relative position bias and patch merging (functions
    torch.fx keeps opaque, lowered by name): values of V1 and V2, and one training step's
    gradients of V1 against PyTorch's."""
    for v2 in (False, True):
        torch.manual_seed(6)
        run_case("Swin%s blocks, shifted windows, patch merging ([2, 9, 7, 32])" % (
            " V2" if v2 else ""), SwinStage(v2).eval(), [torch.randn(2, 9, 7, 32)], device)
    torch.manual_seed(7)
    projected_step("Swin blocks", SwinStage(False).train(), torch.randn(2, 9, 7, 32),
                   torch.randn(2, 5, 4, 64), device)


def clear_of_kinks(model, shape, first_seed):
    """The first input (torch.randn of `shape` from generator seeds first_seed, first_seed + 1,
    ...) for which `model`, run in float64, has no ReLU input within 1e-5 of zero and no max-pool
    window whose two largest values are that close (both relative to the tensor's standard
    deviation). A gradient through such a point is not a continuous function of the forward
    values: a float32 forward that rounds differently from PyTorch's (another summation order)
    may send it the other way, and one such element moves whole gradients by percents. Exact
    ties at zero (windows of ReLU zeros) are not counted: both sides keep the first and the
    ReLU below stops the gradient anyway."""
    probe = copy.deepcopy(model).double()
    near = [0]

    def relu_in(mod, inp):
        v = inp[0]
        near[0] += int((v.abs() < 1e-5 * v.std()).sum())

    def pool_in(mod, inp):
        v = inp[0]
        k, st, pad = mod.kernel_size, mod.stride, mod.padding
        rows = F.unfold(F.pad(v, (pad, pad, pad, pad), value=float("-inf")).flatten(0, 1)
                        .unsqueeze(1), k, stride=st)
        top = rows.topk(2, dim=1).values
        near[0] += int(((top[:, 0] - top[:, 1] < 1e-5 * v.std()) & (top[:, 0] > 0)).sum())

    hooks = [m.register_forward_pre_hook(relu_in) for m in probe.modules()
             if isinstance(m, nn.ReLU)]
    hooks += [m.register_forward_pre_hook(pool_in) for m in probe.modules()
              if isinstance(m, nn.MaxPool2d)]
    for seed in range(first_seed, first_seed + 500):
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
        near[0] = 0
        with torch.no_grad():
            probe(x.double())
        if near[0] == 0:
            break
    for h in hooks:
        h.remove()
    return x, seed


def read_apart(f, out):
    """How many parameters of the gradient graph of a training call's output (out, before its
    backward) are values computed apart from it: the forward's saved values it reads."""
    lib, T = tb_fx.library(), tb_fx._T
    ctx = out.grad_fn  # the call's autograd node: tb_fx._Train's ctx
    wanted = ctx.handles
    seed = f.graph._upload(torch.ones_like(out))
    got = (T * len(wanted))()
    try:
        if lib.tb_grad(ctx.state["outputs"][0], seed, (T * len(wanted))(*wanted), len(wanted),
                       got) != 0:
            raise tb_fx.Error("tb_grad failed")
        present = [got[i] for i in range(len(wanted)) if got[i]]
        lib.tb_ir_text.restype = ctypes.c_void_p
        lib.tb_ir_text.argtypes = [ctypes.POINTER(T), ctypes.c_size_t]
        lib.tb_free.argtypes = [ctypes.c_void_p]
        p = lib.tb_ir_text((T * len(present))(*present), len(present))
        text = ctypes.string_at(p).decode()
        lib.tb_free(p)
    finally:
        lib.tb_tensor_release(seed)
        for i in range(len(wanted)):
            if got[i]:
                lib.tb_tensor_release(got[i])
    return text.count("computed apart")


def training(device):
    """One step of ResNet-18 in training mode (batch norms on the batch's statistics): the
    gradients of every parameter and of the input, and the running statistics, against
    PyTorch's; then an SGD step and a second forward through the same compiled callable.
    The input is one with no ReLU or max pool near a kink (clear_of_kinks)."""
    torch.manual_seed(2)
    ref = torchvision.models.resnet18().train()
    ours = copy.deepcopy(ref)
    # the search from seed 0 stops at 401; starting there costs one float64 forward, not 400
    x, seed = clear_of_kinks(ref, (4, 3, 64, 64), 401)
    label = torch.randint(0, 1000, (4,))
    xr, xo = x.clone().requires_grad_(), x.clone().requires_grad_()
    F.cross_entropy(ref(xr), label).backward()
    f = tb_fx.compile(ours, [xo], device=device)
    lib = tb_fx.library()
    runs = lib.tb_metrics_counter(b"ExecuteTime")
    saved = lib.tb_metrics_counter(b"SavedForGrad")
    out = f(xo)
    # the outputs and every batch norm's running statistics come from one graph (read one by
    # one, each statistic would run a graph of the network up to its batch norm), which also
    # keeps the values the backward reads (the convolutions' outputs, the batch statistics)
    forward_graphs = lib.tb_metrics_counter(b"ExecuteTime") - runs
    saved = lib.tb_metrics_counter(b"SavedForGrad") - saved
    read = read_apart(f, out)  # the values the backward's graph reads: those saved
    runs = lib.tb_metrics_counter(b"ExecuteTime")
    F.cross_entropy(out, label).backward()
    backward_graphs = lib.tb_metrics_counter(b"ExecuteTime") - runs
    worst, where = worst_grad(ours, ref, xo, xr)
    stats = max(rel_err(a, b) for (n, a), (_, b) in zip(ours.named_buffers(),
                                                       ref.named_buffers())
                if a.is_floating_point())
    tracked = all(int(a) == int(b) for (n, a), (_, b) in zip(ours.named_buffers(),
                                                             ref.named_buffers())
                  if n.endswith("num_batches_tracked"))
    check(worst <= 1e-4 and stats <= 1e-5 and tracked and forward_graphs == 1 and
          backward_graphs == 1 and saved >= 20 and read == saved,
          "a training step of ResNet-18 (batch 4, 64x64, input seed %d) on %s: gradients "
          "within %.1e of PyTorch's scale (worst: %s), running statistics within %.1e, "
          "graphs the forward and the backward ran: %d and %d (1 and 1 wanted), forward values "
          "saved for the backward: %d (at least 20 wanted), read by its graph: %d" %
          (seed, device, worst, where, stats, forward_graphs, backward_graphs, saved, read))
    opt_r = torch.optim.SGD(ref.parameters(), lr=0.1)
    opt_o = torch.optim.SGD(ours.parameters(), lr=0.1)
    opt_r.step()
    opt_o.step()
    with torch.no_grad():
        again = f(x)
        want = copy.deepcopy(ours)(x)  # PyTorch on the weights the step left in `ours`
    check(rel_err(again, want) <= 1e-4,
          "after an SGD step, the next forward on %s follows the new weights (error / scale "
          "%.1e)" % (device, rel_err(again, want)))


def released(device):
    """A training call keeps its outputs, leaves and saved values for the backward: released by
    the backward, or when the outputs go without one (under torch.no_grad at once), never
    kept for the life of the process."""
    torch.manual_seed(3)
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                      nn.Flatten(), nn.Linear(8 * 8 * 8, 4)).train()
    x = torch.randn(2, 3, 8, 8)
    f = tb_fx.compile(m, [x], device=device)
    freed = []
    release = tb_fx._State.release

    def counting(state):
        freed.append(len(state.get("keep", [])))
        release(state)

    tb_fx._State.release = counting
    try:
        with torch.no_grad():
            for _ in range(3):
                f(x)
        no_grad = sum(1 for k in freed if k)
        del freed[:]
        for _ in range(3):
            f(x)
        gc.collect()
        dropped = sum(1 for k in freed if k)
        del freed[:]
        y = f(x)
        y.sum().backward(retain_graph=True)  # PyTorch keeps its graph: ours is what refuses
        by_backward = sum(1 for k in freed if k)
        del freed[:]
        try:
            y.sum().backward()  # a second backward: refused (its tensors are gone)
            second = "allowed"
        except RuntimeError as e:
            second = str(e)
        del y
        gc.collect()
        again = freed == [0]  # the call's node went: one release, with nothing left to free
    finally:
        tb_fx._State.release = release
    check(no_grad == 3 and dropped == 3 and by_backward == 1 and again and
          "tb_fx" in second and "retain_graph" in second,
          "a training call's kept tensors on %s are released: under torch.no_grad %d of 3, "
          "outputs dropped without a backward %d of 3, by the backward %d of 1 (nothing more "
          "once its outputs went: %s); a second backward: %s"
          % (device, no_grad, dropped, by_backward, again, second))


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x, k):
        return self.lin(x) * k


def number_input(device):
    """Training with an input that is a number, not a tensor: gradients of the weights and of
    the tensor input as PyTorch's."""
    torch.manual_seed(4)
    m = Scaled().train()
    x = torch.randn(2, 4, requires_grad=True)
    f = tb_fx.compile(m, [x, 2.0], device=device)
    f(x, 2.0).sum().backward()
    got = (m.lin.weight.grad.clone(), x.grad.clone())
    m.zero_grad()
    x.grad = None
    m(x, 2.0).sum().backward()
    err = max(rel_err(got[0], m.lin.weight.grad), rel_err(got[1], x.grad))
    check(err <= 1e-6, "training with a number among the inputs on %s: gradients within %.1e of "
          "PyTorch's" % (device, err))


def errors(device):
    m = torchvision.models.resnet18().eval()
    x = torch.randn(1, 3, 32, 32)
    f = tb_fx.compile(m, [x], device=device)
    m.layer1[0].bn1.train()
    try:
        f(x)
        check(False, "a batch norm switched to training after an eval compile on %s is "
              "refused" % device)
    except tb_fx.Error as e:
        check("training mode" in str(e), "a batch norm switched to training after an eval "
              "compile on %s is refused: %s" % (device, e))
    try:
        tb_fx.compile(nn.Linear(3, 2), [torch.randn(1, 3)], device="nosuch:0")
        check(False, "an unknown device is refused")
    except tb_fx.Error as e:
        check("nosuch" in str(e), "an unknown device is refused: %s" % e)
    try:
        tb_fx.compile(nn.Softplus(beta=2.0), [torch.randn(3)], device=device)(torch.randn(3))
        check(False, "softplus with beta 2 is refused on %s" % device)
    except tb_fx.Error as e:
        check("softplus" in str(e), "softplus with beta 2 is refused on %s: %s" % (device, e))
    f = tb_fx.compile(nn.Linear(3, 2), [torch.randn(1, 3)], device=device)
    try:
        f(torch.randn(1, 4))
        check(False, "an input of the wrong shape on %s is refused" % device)
    except tb_fx.Error as e:
        check("tb_linear" in str(e), "an input of the wrong shape on %s is refused: %s" %
              (device, e))


def fallback(device):
    x = torch.randn(2, 5)
    m = WithFallback().eval()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        f = tb_fx.compile(m, [x], device=device)
    got = f(x)
    check(f.fallback == ["cumsum"] and any("cumsum" in str(w.message) for w in seen) and
          rel_err(got, m(x)) <= 1e-6,
          "a node without a lowering (cumsum) runs in PyTorch on %s, reported: %s" %
          (device, f.fallback))
    try:
        tb_fx.compile(m, [x], device=device, strict=True)
        check(False, "strict=True refuses a node without a lowering")
    except tb_fx.Error as e:
        check("cumsum" in str(e), "strict=True refuses a node without a lowering: %s" % e)


# inputs of the sweep: 64x64 where a model takes it, else the smallest size it accepts
SWEEP_SIZE = {"inception_v3": 80, "maxvit_t": 224, "vit_b_16": 224, "vit_b_32": 224,
              "vit_h_14": 224, "vit_l_16": 224, "vit_l_32": 224}


def sweep(devices, only, max_params):
    """Every classification model of torchvision (batch 1): traced with torch.fx or not, and
    where it is, compiled with strict=True (a node without a lowering is an error) on each
    device and compared with PyTorch. Prints one line per model and device and a count."""
    names = torchvision.models.list_models(module=torchvision.models)
    if only:
        names = [n for n in names if n in only.split(",")]
    traced, big, untraceable = [], [], []
    for name in names:
        torch.manual_seed(1)
        m = getattr(torchvision.models, name)().eval()
        with torch.no_grad():  # weights initialised to zeros (ViT's head) would hide errors
            for p in m.parameters():
                if p.dim() >= 2 and not p.any():
                    p.normal_(0, 0.02)
        params = sum(p.numel() for p in m.parameters())
        if params > max_params:
            big.append("%s (%.0fM parameters)" % (name, params / 1e6))
            continue
        try:
            tb_fx._trace(m, 1)
        except Exception as e:  # noqa: BLE001 (whatever the tracer raises)
            untraceable.append("%s (%s)" % (name, str(e).splitlines()[0][:80]))
            print("untraceable %s: %s" % (name, str(e).splitlines()[0][:200]), flush=True)
            continue
        s = SWEEP_SIZE.get(name, 64)
        x = torch.randn(1, 3, s, s)
        with torch.no_grad():
            want = m(x)
        ok = True
        for device in devices:
            try:
                f = tb_fx.compile(m, [x], device=device, strict=True)
                err = rel_err(f(x), want)
                ok = check(err <= 1e-5, "%s (1x3x%dx%d) on %s: error / output scale %.1e" %
                           (name, s, s, device, err)) and ok
            except tb_fx.Error as e:
                ok = check(False, "%s (1x3x%dx%d) on %s: %s" % (name, s, s, device,
                                                               str(e)[:300])) and ok
        traced.append((name, ok))
    good = [n for n, ok in traced if ok]
    print("sweep: %d torchvision classification models; %d traced by torch.fx, %d of them "
          "match PyTorch on %s with no graph break; not traceable: %s; not run (over %.0fM "
          "parameters): %s" % (len(names), len(traced), len(good), ", ".join(devices),
                               ", ".join(untraceable) or "none", max_params / 1e6,
                               ", ".join(big) or "none"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--devices", default="cpu,native,opencl")
    ap.add_argument("--all", action="store_true",
                    help="instead of the checks: every torchvision classification model")
    ap.add_argument("--only", default="", help="with --all: these models (comma-separated)")
    ap.add_argument("--max-params", type=float, default=150e6,
                    help="with --all: models with more parameters are listed, not run")
    a = ap.parse_args()
    torch.manual_seed(0)
    devices = []
    for d in a.devices.split(","):
        try:
            tb_fx.compile(nn.Identity(), [torch.zeros(1)], device=d + ":0")(torch.zeros(1))
            devices.append(d + ":0")
        except tb_fx.Error as e:
            print("skipped device %s: %s" % (d, e))
    if a.all:
        sweep(devices, a.only, a.max_params)
        print("%d passed, %d failed" % (RESULTS["passed"], RESULTS["failed"]))
        return 1 if RESULTS["failed"] else 0
    size = 32 if a.quick else 64
    models = [("resnet18", size), ("mobilenet_v2", size), ("squeezenet1_0", 64),
              ("vgg11", 32), ("alexnet", 64)]
    if a.quick:
        models = models[:3]
    for device in devices:
        for name, s in models:
            torch.manual_seed(1)
            m = getattr(torchvision.models, name)().eval()
            run_case("%s (batch 2, %dx%d)" % (name, s, s), m, [torch.randn(2, 3, s, s)], device)
        run_case("functions and methods", Small().eval(), [torch.randn(4, 6), torch.randn(4, 6)],
                 device)
        run_case("shapes, indexing, chunk and einsum", Indexing().eval(),
                 [torch.randn(3, 4, 5), torch.randn(2, 3, 4)], device)
        fallback(device)
        replays(device)
        passthrough(device)
        transformer(device)
        swin(device)
        training(device)
        released(device)
        number_input(device)
        errors(device)
    print("%d passed, %d failed" % (RESULTS["passed"], RESULTS["failed"]))
    return 1 if RESULTS["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
