"""PyTorch's side of tests/test_half.c and tests/test_half_opencl.c: f16 and bf16 conversions
and ops as PyTorch computes them on the CPU.

Usage: /usr/bin/python3 tests/half_torch.py
Standard library and torch only. Prints "torch-unavailable REASON" and exits 0 when torch
cannot be imported (the C tests then skip).

Output, one record a line, values as hexadecimal bit patterns:
    h2f DTYPE H F          every 16-bit pattern H of DTYPE (f16, bf16) and its f32 bits F
    f2h DTYPE F H          an f32 F (exact values, neighbours, midpoints and their neighbours
                           of every pattern, specials) and DTYPE's pattern H for it
    case NAME OP ARG       an op: OP is the library's name, ARG an integer (an axis) or a
                           float (a wrapped number), "-" for none
    in DTYPE RANK DIMS... VALUES...     its inputs, in order
    out DTYPE RANK DIMS... VALUES...    what PyTorch gives
    end
An op PyTorch 1.13 does not implement for a 16-bit dtype on the CPU (exp, matmul, softmax
... on f16) is computed as PyTorch computes the ones it has: in f32, rounded once to the
dtype. Batched matmul is always computed that way (see ops()).
"""
import struct
import sys

try:
    import torch
except Exception as e:  # noqa: BLE001 (any failure to import means no torch here)
    print("torch-unavailable %s" % str(e).replace("\n", " "))
    sys.exit(0)

DT = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32, "i32": torch.int32,
      "i64": torch.int64}
BITS16 = {"f16": torch.int16, "bf16": torch.int16}
out = []


def f32_bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def bits_f32(u):
    return struct.unpack("<f", struct.pack("<I", u))[0]


def hexes(t, name):
    """The bit patterns of a tensor's elements as hex words."""
    t = t.contiguous().reshape(-1)
    if name in ("f16", "bf16"):
        return ["%04x" % (v & 0xFFFF) for v in t.view(torch.int16).tolist()]
    if name == "f32":
        return ["%08x" % (v & 0xFFFFFFFF) for v in t.view(torch.int32).tolist()]
    return ["%x" % (v & 0xFFFFFFFFFFFFFFFF) for v in t.tolist()]


def conversions(name):
    dt = DT[name]
    pats = torch.arange(65536, dtype=torch.int32).to(torch.int16)
    vals = pats.view(dt).to(torch.float32)
    for h, f in zip(range(65536), hexes(vals, "f32")):
        out.append("h2f %s %04x %s" % (name, h, f))
    # f32 -> 16 bits: each finite pattern's value, its f32 neighbours, and the midpoint to the
    # next pattern with its f32 neighbours
    xs = []
    fl = vals.tolist()
    for h in range(0, 65536):
        v = fl[h]
        if v != v or abs(v) == float("inf"):
            continue
        u = f32_bits(v)
        xs += [u, u + 1, u - 1 if u & 0x7FFFFFFF else u]
        nxt = fl[h + 1] if h + 1 < 65536 and (h + 1) & 0x7FFF else None
        if nxt is not None and nxt == nxt:
            mid = (v + nxt) / 2.0
            m = f32_bits(mid)
            if bits_f32(m) == mid:
                xs += [m, m + 1, m - 1]
    xs += [0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 0x7F800001, 0x7F7FFFFF, 0x477FF000,
           0x477FEFFF, 0x477FF001, 0x33000000, 0x33000001, 0x32FFFFFF, 0x00000001, 0x80000001]
    xs = [x & 0xFFFFFFFF for x in xs]
    t = torch.tensor(xs, dtype=torch.int64).to(torch.int32).view(torch.float32)
    for x, h in zip(xs, hexes(t.to(dt), name)):
        out.append("f2h %s %08x %s" % (name, x, h))


def emit_tensor(tag, t, name):
    dims = list(t.shape)
    out.append("%s %s %d %s %s" % (tag, name, len(dims), " ".join(str(d) for d in dims),
                                   " ".join(hexes(t, name))))


def run(fn, dt, *xs):
    """fn on the inputs in PyTorch; where it is not implemented for dt, in f32 rounded to dt."""
    try:
        return fn(*xs)
    except RuntimeError:
        ys = [x.float() if x.dtype == dt else x for x in xs]
        return fn(*ys).to(dt)


UNARY = {
    "neg": torch.neg, "abs": torch.abs, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt,
    "tanh": torch.tanh, "sigmoid": torch.sigmoid, "relu": torch.relu,
    "gelu": torch.nn.functional.gelu, "sin": torch.sin, "reciprocal": torch.reciprocal,
    "floor": torch.floor, "round": torch.round,
}
BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
    "maximum": torch.maximum, "pow": torch.pow,
}


def case(name, op, arg, inputs, result):
    out.append("case %s %s %s" % (name, op, arg))
    for t in inputs:
        emit_tensor("in", t, dtype_name(t.dtype))
    emit_tensor("out", result, dtype_name(result.dtype))
    out.append("end")


def dtype_name(dt):
    for k, v in DT.items():
        if v == dt:
            return k
    raise ValueError(dt)


def ops(name, g):
    dt = DT[name]

    def rnd(*dims, lo=-2.0, hi=2.0):
        return (torch.rand(*dims, generator=g) * (hi - lo) + lo).to(dt)

    for op, fn in UNARY.items():
        lo = 0.05 if op in ("log", "sqrt", "reciprocal") else -3.0
        for dims in ((7, 13), (1,), (0, 3)):
            x = rnd(*dims, lo=lo, hi=3.0)
            case("%s_%s_%s" % (op, name, "x".join(map(str, dims))), op, "-", [x], run(fn, dt, x))
    for op, fn in BINARY.items():
        lo = 0.1 if op == "pow" else -3.0
        for da, db in (((7, 13), (7, 13)), ((7, 1), (1, 13)), ((5,), (1,))):
            a, b = rnd(*da, lo=lo, hi=3.0), rnd(*db, lo=-2.0 if op != "div" else 0.5, hi=3.0)
            case("%s_%s" % (op, name), op, "-", [a, b], run(fn, dt, a, b))
    x = rnd(9, 11)
    case("add_scalar_%s" % name, "add_scalar", "0.1", [x], run(lambda t: t + 0.1, dt, x))
    case("mul_scalar_%s" % name, "mul_scalar", "3", [x], run(lambda t: t * 3.0, dt, x))
    # reductions of positive values (no cancellation: the order of the f32 sums stays within
    # one unit of the 16-bit result)
    x = rnd(6, 300, lo=0.0, hi=1.0)
    case("sum_all_%s" % name, "sum", "-1", [x], run(lambda t: t.sum(), dt, x))
    case("sum_1_%s" % name, "sum", "1", [x], run(lambda t: t.sum(1), dt, x))
    case("mean_1_%s" % name, "mean", "1", [x], run(lambda t: t.mean(1), dt, x))
    x = rnd(6, 300)
    case("max_1_%s" % name, "max", "1", [x], run(lambda t: t.amax(1), dt, x))
    case("softmax_1_%s" % name, "softmax", "1", [x], run(lambda t: t.softmax(1), dt, x))
    case("log_softmax_1_%s" % name, "log_softmax", "1", [x],
         run(lambda t: t.log_softmax(1), dt, x))
    a, b = rnd(17, 64, lo=0.0, hi=1.0), rnd(64, 23, lo=0.0, hi=1.0)
    case("matmul_%s" % name, "matmul", "-", [a, b], run(torch.matmul, dt, a, b))
    a, b = rnd(3, 5, 40, lo=0.0, hi=1.0), rnd(3, 40, 6, lo=0.0, hi=1.0)
    # batched: torch 1.13's small-matrix bmm accumulates bf16 in bf16; the f32 accumulation
    # (PyTorch 2's, and this library's) rounded once is the reference
    case("bmm_%s" % name, "matmul", "-", [a, b], torch.matmul(a.float(), b.float()).to(dt))
    # casts, in and out; fused chains round each op's result
    x = torch.rand(8, 16, generator=g) * 200 - 100
    case("cast_f32_%s" % name, "cast", name, [x], x.to(dt))
    case("cast_%s_f32" % name, "cast", "f32", [x.to(dt)], x.to(dt).float())
    case("cast_%s_i32" % name, "cast", "i32", [x.to(dt)], x.to(dt).to(torch.int32))
    x = rnd(5, 33)
    case("chain_%s" % name, "chain", "-", [x],
         run(lambda t: ((t * 1.7 + 0.3).exp() - t).tanh() * t, dt, x))
    # rows long enough for the kernels that work 16 lanes at a time: every op of a chain
    # rounded (tb's vector set), a row broadcast, mixed with f32 through casts, reductions,
    # softmax, and a matmul big enough to pack its operands
    def r(fn, *xs):
        return run(fn, dt, *xs)

    x, y, c = rnd(16, 1024), rnd(16, 1024), rnd(16, 1)
    a = r(lambda t: t + 0.3, r(lambda t: t * 1.7, x))
    b = r(torch.sub, r(torch.exp, a), y)
    n1 = r(torch.div, r(torch.relu, b), r(lambda t: t + 1.0, r(torch.abs, x)))
    n2 = r(torch.mul, r(torch.sqrt, r(torch.abs, y)), c)
    case("vchain_%s" % name, "vchain", "-", [x, y, c], r(torch.maximum, n1, r(torch.neg, n2)))
    f = torch.rand(16, 1024, generator=g) * 4 - 2
    fb = f.view(torch.int32)  # NaNs whose low bits would carry a rounding into the exponent
    fb[0, 3], fb[1, 4], fb[2, 5], fb[3, 6] = 0x7F800001, 0x7FFFFFFF, -1, 0x7F80FFFF
    case("vmixed_%s" % name, "vmixed", name, [x, f], (x.float() * f + 1.0).to(dt))
    x = rnd(8, 2048, lo=0.0, hi=1.0)
    case("vsum_1_%s" % name, "sum", "1", [x], run(lambda t: t.sum(1), dt, x))
    x = rnd(8, 2048)
    case("vmax_1_%s" % name, "max", "1", [x], run(lambda t: t.amax(1), dt, x))
    case("vsoftmax_1_%s" % name, "softmax", "1", [x], run(lambda t: t.softmax(1), dt, x))
    a, b = rnd(70, 96, lo=0.0, hi=1.0), rnd(96, 80, lo=0.0, hi=1.0)
    case("vmatmul_%s" % name, "matmul", "-", [a, b], run(torch.matmul, dt, a, b))
    # the same 16 lanes at a time through overflow, subnormal results, NaN and infinities
    spec = ([65504.0, 65520.0, 6.0e-8, 3.0e-8, 1.0e-5, -0.0, 3.0e38, 1.0e-39, 1.0e-41]
            + [float("nan"), float("inf"), -float("inf"), 2.5, -7.0, 0.1, 1000.0])
    a = torch.tensor(spec * 64, dtype=torch.float32).reshape(16, 64)
    a = (a * (torch.rand(16, 64, generator=g) * 0.5 + 0.75)).to(dt)
    b = torch.tensor([1.0001, 0.5, -2.0, 0.75, 1.5, 0.0078125, -1.0, 3.0] * 128).reshape(16, 64)
    b = b.to(dt)
    case("vspecial_mul_%s" % name, "mul", "-", [a, b], run(torch.mul, dt, a, b))
    e = (torch.rand(16, 64, generator=g) * 32 - 20).to(dt)
    e[3, 5], e[7, 9], e[11, 1] = float("nan"), float("inf"), -float("inf")
    case("vspecial_exp_%s" % name, "exp", "-", [e], run(torch.exp, dt, e))
    # overflow to infinity, NaN
    big = torch.tensor([300.0, -300.0, 60000.0, 1e38, 2.0], dtype=torch.float32).to(dt)
    case("overflow_mul_%s" % name, "mul", "-", [big, big], run(torch.mul, dt, big, big))
    case("overflow_exp_%s" % name, "exp", "-", [big], run(torch.exp, dt, big))
    odd = torch.tensor([-1.0, 0.0, float("nan"), float("inf"), -float("inf")]).to(dt)
    case("nan_log_%s" % name, "log", "-", [odd], run(torch.log, dt, odd))
    case("nan_sum_%s" % name, "sum", "-1", [odd], run(lambda t: t.sum(), dt, odd))
    # promotion: with a rank-0 f32 tensor the 16-bit dtype wins; with an i64 tensor too
    x = rnd(4, 6)
    s0 = torch.tensor(0.375, dtype=torch.float32)
    case("promote_0d_%s" % name, "add", "-", [x, s0], run(torch.add, dt, x, s0))
    i = torch.arange(6, dtype=torch.int64)
    case("promote_i64_%s" % name, "mul", "-", [x, i], run(torch.mul, dt, x, i))


def main():
    for name in ("f16", "bf16"):
        conversions(name)
    g = torch.Generator().manual_seed(16)
    for name in ("f16", "bf16"):
        ops(name, g)
    a = (torch.rand(3, 4, generator=g) * 4 - 2).to(torch.float16)
    b = (torch.rand(3, 4, generator=g) * 4 - 2).to(torch.bfloat16)
    case("promote_f16_bf16", "add", "-", [a, b], a + b)
    sys.stdout.write("\n".join(out) + "\n")


main()
