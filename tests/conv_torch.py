"""PyTorch's side of tests/test_conv.c: convolution and pooling cases in f64, forward values
and the gradients of sum(y * r) with respect to every floating-point input.

Usage: /usr/bin/python3 tests/conv_torch.py CASES_FILE
Standard library and torch only. Prints "torch-unavailable REASON" and exits 0 when torch
cannot be imported (the C test then skips).

The file holds cases, each:
    case NAME OP N INTS...          OP: conv convt maxpool avgpool adaptive
    t ROLE RANK DIMS... VALUES...   ROLE: x w b r (r: the seed of the gradient)
    end
Per case it prints "case NAME", then "y N VALUES..." and "g ROLE N VALUES..." for x, w, b.
"""
import sys

try:
    import torch
    import torch.nn.functional as F
except Exception as e:  # noqa: BLE001 (any failure to import means no torch here)
    print("torch-unavailable %s" % str(e).replace("\n", " "))
    sys.exit(0)


def run(op, ints, t):
    n = ints[0]
    a = ints[1:]
    x = t["x"]
    if op == "conv":
        s, p, d, g = a[0:n], a[n:2 * n], a[2 * n:3 * n], a[3 * n]
        fn = F.conv1d if n == 1 else F.conv2d
        return fn(x, t["w"], t.get("b"), stride=s, padding=p, dilation=d, groups=g)
    if op == "convt":
        s, p, o, d, g = a[0:n], a[n:2 * n], a[2 * n:3 * n], a[3 * n:4 * n], a[4 * n]
        fn = F.conv_transpose1d if n == 1 else F.conv_transpose2d
        return fn(x, t["w"], t.get("b"), stride=s, padding=p, output_padding=o, groups=g,
                  dilation=d)
    if op == "maxpool":
        k, s, p, d, c = a[0:n], a[n:2 * n], a[2 * n:3 * n], a[3 * n:4 * n], a[4 * n]
        fn = F.max_pool1d if n == 1 else F.max_pool2d
        return fn(x, k, s, p, d, ceil_mode=bool(c))
    if op == "avgpool":
        k, s, p, c, inc = a[0:n], a[n:2 * n], a[2 * n:3 * n], a[3 * n], a[3 * n + 1]
        fn = F.avg_pool1d if n == 1 else F.avg_pool2d
        return fn(x, k, s, p, ceil_mode=bool(c), count_include_pad=bool(inc))
    if op == "adaptive":
        fn = F.adaptive_avg_pool1d if n == 1 else F.adaptive_avg_pool2d
        return fn(x, a[0:n])
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
        name, op, ints = w[1], w[2], [int(v) for v in w[3:]]
        t = {}
        while lines[i] != "end":
            f = lines[i].split()
            i += 1
            rank = int(f[2])
            dims = [int(v) for v in f[3:3 + rank]]
            vals = [float(v) for v in f[3 + rank:]]
            t[f[1]] = torch.tensor(vals, dtype=torch.float64).reshape(dims)
        ins = [k for k in ("x", "w", "b") if k in t]
        for k in ins:
            t[k].requires_grad_(True)
        print("case", name)
        y = run(op, ints, t)
        emit("y", y)
        grads = torch.autograd.grad((y * t["r"]).sum(), [t[k] for k in ins])
        for k, g in zip(ins, grads):
            emit("g " + k, g)
    sys.stdout.flush()


main()
