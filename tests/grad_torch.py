"""PyTorch's side of tests/test_grad_torch.c: replays random graphs op by op and prints the
gradients torch.autograd.grad gives for every floating-point input.

Usage: /usr/bin/python3 tests/grad_torch.py GRAPHS_FILE
Standard library and torch only. Prints "torch-unavailable REASON" and exits 0 when torch
cannot be imported (the C test then skips).

The file holds graphs, each:
    graph K
    in ID DTYPE RANK DIMS... N VALUES...      an input (floating-point inputs require grad)
    op ID NAME NARGS ARGS... NINTS INTS... NF FLOATS...
    out ID N SEED...                          the output and the seed of its gradient
    end
For each graph, in order, it prints "graph K" and then one line per floating-point input:
"grad ID none" (no path from it to the output) or "grad ID N VALUES..." (%.17g), or
"graph K error MESSAGE" when torch refuses the graph.

Two bugs of torch 1.13 are worked around, each where its op is applied: f32 gelu's backward
given a non-contiguous gradient (_Gelu) and clamp's backward with tensor bounds that broadcast
x to a larger shape ("clamp_t").
"""
import sys

try:
    import torch
    import torch.nn.functional as F
except Exception as e:  # noqa: BLE001 (any failure to import means no torch here)
    print("torch-unavailable %s" % str(e).replace("\n", " "))
    sys.exit(0)

DTYPES = {
    "f64": torch.float64,
    "f32": torch.float32,
    "bool": torch.bool,
    "i64": torch.int64,
}
REDUCTIONS = ("mean", "sum", "none")


def axes_of(x, ints):
    """Reduction axes: ints = [keepdim, n, axes...]; n == 0 means every axis."""
    n = ints[1]
    if n == 0:
        return list(range(x.dim()))
    return [a % x.dim() for a in ints[2:2 + n]]


def reduce(name, x, ints):
    keep = bool(ints[0])
    axes = axes_of(x, ints)
    if not axes:  # rank 0: each output element is its one input element
        return x * 1 if name != "sum" else x.sum()
    if name == "sum":
        return torch.sum(x, dim=axes, keepdim=keep)
    if name == "mean":
        return torch.mean(x, dim=axes, keepdim=keep)
    if name == "max":  # amax/amin share the gradient evenly between ties, as max() does
        return torch.amax(x, dim=axes, keepdim=keep)
    if name == "min":
        return torch.amin(x, dim=axes, keepdim=keep)
    # prod takes one dim at a time
    for a in sorted(axes, reverse=True):
        x = torch.prod(x, dim=a, keepdim=True)
    if not keep:
        for a in sorted(axes, reverse=True):
            x = x.squeeze(a)
    return x


class _Gelu(torch.autograd.Function):
    """F.gelu whose backward gets a contiguous gradient: torch 1.13's f32 gelu_backward reads a
    non-contiguous gradient of a contiguous input wrongly (garbage values), e.g.
    gelu_backward(torch.ones(5, 4, 3).transpose(0, 1), torch.full((4, 5, 3), -1.8))."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return F.gelu(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return torch.ops.aten.gelu_backward(g.contiguous(), x.contiguous())


UNARY = {
    "neg": torch.neg,
    "abs": torch.abs,
    "exp": torch.exp,
    "log": torch.log,
    "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt,
    "sin": torch.sin,
    "cos": torch.cos,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "relu": torch.relu,
    "gelu": _Gelu.apply,
    "silu": F.silu,
    "softplus": F.softplus,
    "mish": F.mish,
    "reciprocal": torch.reciprocal,
    "floor": torch.floor,
    "ceil": torch.ceil,
    "round": torch.round,
    "sign": torch.sign,
    "erf": torch.erf,
    "detach": torch.detach,
    "logical_not": torch.logical_not,
}
BINARY = {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "div": torch.div,
    "pow": torch.pow,
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "lt": torch.lt,
    "le": torch.le,
    "gt": torch.gt,
    "ge": torch.ge,
    "eq": torch.eq,
    "ne": torch.ne,
    "logical_and": torch.logical_and,
    "logical_or": torch.logical_or,
}
SCALAR = {
    "add_s": lambda x, f: x + f,
    "sub_s": lambda x, f: x - f,
    "mul_s": lambda x, f: x * f,
    "div_s": lambda x, f: x / f,
    "pow_s": lambda x, f: torch.pow(x, f),
}


def apply(name, a, ints, fl):
    """One op of the graph: a = operand tensors, ints and fl its integer and float params."""
    if name in UNARY:
        return UNARY[name](a[0])
    if name in BINARY:
        return BINARY[name](a[0], a[1])
    if name in SCALAR:
        return SCALAR[name](a[0], fl[0])
    if name == "cast":
        return a[0].to(DTYPES[["f64", "f32"][ints[0]]])
    if name == "where":
        return torch.where(a[0], a[1], a[2])
    if name == "clamp":
        return torch.clamp(a[0], fl[0], fl[1])
    if name == "clamp_t":
        # broadcast first: torch 1.13's clamp backward fails when x is smaller than a bound
        # ("output with shape [1] doesn't match the broadcast shape [2, 4]")
        return torch.clamp(*torch.broadcast_tensors(a[0], a[1], a[2]))
    if name in ("sum", "mean", "max", "min", "prod"):
        return reduce(name, a[0], ints)
    if name == "argmax":
        return torch.argmax(a[0], dim=ints[0], keepdim=bool(ints[1]))
    if name == "argmin":
        return torch.argmin(a[0], dim=ints[0], keepdim=bool(ints[1]))
    if name == "matmul":
        return torch.matmul(a[0], a[1])
    if name == "softmax":
        return torch.softmax(a[0], ints[0])
    if name == "log_softmax":
        return torch.log_softmax(a[0], ints[0])
    if name == "layer_norm":
        nd, has_w, has_b = ints
        w = a[1] if has_w else None
        b = a[1 + has_w] if has_b else None
        return F.layer_norm(a[0], a[0].shape[a[0].dim() - nd:], w, b, fl[0])
    if name == "reshape":
        return a[0].reshape(ints)
    if name == "permute":
        return a[0].permute(ints)
    if name == "transpose":
        return a[0].transpose(ints[0], ints[1])
    if name == "expand":
        return a[0].expand(ints)
    if name == "squeeze":
        return a[0].squeeze(ints[0])
    if name == "unsqueeze":
        return a[0].unsqueeze(ints[0])
    if name == "slice":
        dim, start, end, step = ints
        index = [slice(None)] * a[0].dim()
        index[dim % a[0].dim()] = slice(start, end, step)
        return a[0][tuple(index)]
    if name == "flip":
        return torch.flip(a[0], ints)
    if name == "concat":
        return torch.cat(a, ints[0])
    if name == "pad":
        return F.pad(a[0], ints, mode="constant", value=fl[0])
    if name == "gather":
        return torch.gather(a[0], ints[0], a[1])
    if name == "index_select":
        return torch.index_select(a[0], ints[0], a[1])
    if name == "scatter_add":
        return a[0].scatter_add(ints[0], a[1], a[2])
    if name == "index_add":
        return a[0].index_add(ints[0], a[1], a[2])
    if name == "cross_entropy":
        return F.cross_entropy(a[0], a[1], reduction=REDUCTIONS[ints[0]], label_smoothing=fl[0])
    if name == "nll_loss":
        return F.nll_loss(a[0], a[1], reduction=REDUCTIONS[ints[0]])
    if name == "mse_loss":
        return F.mse_loss(a[0], a[1], reduction=REDUCTIONS[ints[0]])
    raise ValueError("unknown op '%s'" % name)


def run_graph(lines):
    """The gradient lines of one graph (a list of token lists)."""
    vals = {}
    inputs = []  # (id, tensor) of the floating-point inputs, in order
    out = seed = None
    for t in lines:
        if t[0] == "in":
            vid, dtype, rank = int(t[1]), DTYPES[t[2]], int(t[3])
            dims = [int(d) for d in t[4:4 + rank]]
            n = int(t[4 + rank])
            data = [float(v) for v in t[5 + rank:5 + rank + n]]
            x = torch.tensor(data, dtype=torch.float64).to(dtype).reshape(dims)
            if dtype.is_floating_point:
                x.requires_grad_(True)
                inputs.append((vid, x))
            vals[vid] = x
        elif t[0] == "op":
            vid, name, nargs = int(t[1]), t[2], int(t[3])
            args = [vals[int(v)] for v in t[4:4 + nargs]]
            at = 4 + nargs
            nints = int(t[at])
            ints = [int(v) for v in t[at + 1:at + 1 + nints]]
            at += 1 + nints
            nf = int(t[at])
            fl = [float(v) for v in t[at + 1:at + 1 + nf]]
            vals[vid] = apply(name, args, ints, fl)
        elif t[0] == "out":
            out = vals[int(t[1])]
            n = int(t[2])
            seed = torch.tensor([float(v) for v in t[3:3 + n]], dtype=torch.float64)
            seed = seed.to(out.dtype).reshape(out.shape)
    grads = [None] * len(inputs)
    if out.requires_grad:
        grads = torch.autograd.grad(out, [x for _, x in inputs], grad_outputs=seed,
                                    allow_unused=True)
    res = []
    for (vid, _), g in zip(inputs, grads):
        if g is None:
            res.append("grad %d none" % vid)
        else:
            v = g.detach().to(torch.float64).reshape(-1).tolist()
            res.append("grad %d %d %s" % (vid, len(v), " ".join("%.17g" % x for x in v)))
    return res


def main():
    torch.set_num_threads(1)
    with open(sys.argv[1]) as f:
        text = f.read().split("\n")
    out = []
    k, lines = None, []
    for line in text:
        t = line.split()
        if not t:
            continue
        if t[0] == "graph":
            k, lines = t[1], []
        elif t[0] == "end":
            try:
                res = run_graph(lines)
                out.append("graph %s" % k)
                out.extend(res)
            except Exception as e:  # noqa: BLE001 (reported to the C side as the graph's result)
                out.append("graph %s error %s: %s" % (k, type(e).__name__,
                                                      str(e).replace("\n", " ")))
        else:
            lines.append(t)
    sys.stdout.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
