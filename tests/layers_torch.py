"""PyTorch's side of tests/test_layers.c: the layers of real models in f64, forward values,
the gradients of sum(y * r) with respect to every input marked for it, and the running
statistics batch norm updates.

Usage: /usr/bin/python3 tests/layers_torch.py CASES_FILE
Standard library and torch only. Prints "torch-unavailable REASON" and exits 0 when torch
cannot be imported (the C test then skips).

The file holds cases, each:
    case NAME OP
    i INTS...
    f FLOATS...
    t ROLE DTYPE GRAD RANK DIMS... VALUES...   DTYPE f64, i64 or bool; GRAD 1: differentiate
    end
Per case it prints "case NAME", "y N VALUES...", then "g ROLE N VALUES..." for each tensor
marked GRAD (in file order), then "s ROLE N VALUES..." for batch norm's running statistics.
"""
import math
import sys

try:
    import torch
    import torch.nn.functional as F
except Exception as e:  # noqa: BLE001 (any failure to import means no torch here)
    print("torch-unavailable %s" % str(e).replace("\n", " "))
    sys.exit(0)

DTYPES = {"f64": torch.float64, "i64": torch.int64, "bool": torch.bool}


def attention(q, k, v, mask, causal, scale):
    """softmax(q k^T * scale + mask) v, the definition (torch 1.13 has no fused one)."""
    if scale == 0:
        scale = 1.0 / math.sqrt(q.shape[-1])
    s = torch.matmul(q, k.transpose(-2, -1)) * scale
    if causal:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        s = s.masked_fill(~keep, float("-inf"))
    elif mask is not None and mask.dtype == torch.bool:
        s = s.masked_fill(~mask, float("-inf"))
    elif mask is not None:
        s = s + mask
    return torch.matmul(torch.softmax(s, -1), v)


def run(op, ints, fl, t):
    x = t.get("x")
    if op == "linear":
        return F.linear(x, t["w"], t.get("b"))
    if op == "embedding":
        return F.embedding(t["idx"], t["w"])
    if op == "hardtanh":
        return F.hardtanh(x, fl[0], fl[1])
    if op == "relu6":
        return F.relu6(x)
    if op == "hardsigmoid":
        return F.hardsigmoid(x)
    if op == "hardswish":
        return F.hardswish(x)
    if op == "tril":
        return torch.tril(x, ints[0])
    if op == "triu":
        return torch.triu(x, ints[0])
    if op == "masked_fill":
        return x.masked_fill(t["m"], fl[0])
    if op == "batch_norm":
        return F.batch_norm(x, t.get("rm"), t.get("rv"), t.get("w"), t.get("b"),
                            training=bool(ints[0]), momentum=fl[0], eps=fl[1])
    if op == "sdpa":
        return attention(t["q"], t["k"], t["v"], t.get("m"), bool(ints[0]), fl[0])
    if op == "interpolate":
        mode = "nearest" if ints[0] == 0 else ("bilinear" if x.dim() == 4 else "linear")
        kw = {} if ints[0] == 0 else {"align_corners": bool(ints[1])}
        return F.interpolate(x, size=ints[2:], mode=mode, **kw)
    raise ValueError("unknown op " + op)


def emit(tag, v):
    flat = v.detach().reshape(-1).tolist()
    print(tag, len(flat), " ".join("%.17g" % f for f in flat))


def main():
    lines = open(sys.argv[1]).read().split("\n")
    i = 0
    while i < len(lines):
        w = lines[i].split()
        i += 1
        if not w or w[0] != "case":
            continue
        name, op = w[1], w[2]
        ints = [int(v) for v in lines[i].split()[1:]]
        fl = [float(v) for v in lines[i + 1].split()[1:]]
        i += 2
        t, grad_roles = {}, []
        while lines[i] != "end":
            f = lines[i].split()
            i += 1
            role, dt, g, rank = f[1], DTYPES[f[2]], int(f[3]), int(f[4])
            dims = [int(v) for v in f[5:5 + rank]]
            vals = [float(v) for v in f[5 + rank:]]
            if dt == torch.float64:
                v = torch.tensor(vals, dtype=dt)
            else:
                v = torch.tensor([int(x) for x in vals], dtype=torch.int64).to(dt)
            t[role] = v.reshape(dims)
            if g:
                t[role].requires_grad_(True)
                grad_roles.append(role)
        print("case", name)
        y = run(op, ints, fl, t)
        emit("y", y)
        if grad_roles:
            grads = torch.autograd.grad((y * t["r"]).sum(), [t[k] for k in grad_roles])
            for k, g in zip(grad_roles, grads):
                emit("g " + k, g)
        for k in ("rm", "rv"):
            if op == "batch_norm" and k in t:
                emit("s " + k, t[k])
    sys.stdout.flush()


main()
