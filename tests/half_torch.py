"""PyTorch's side of tests/test_half.c and tests/test_half_opencl.c: f16 and bf16 conversions
and ops as PyTorch computes them on the CPU.

Usage: /usr/bin/python3 tests/half_torch.py
Standard library and torch only. Prints "torch-unavailable REASON" and exits 0 when torch
cannot be imported (the C tests then skip).

Output, one record a line, values as hexadecimal bit patterns:
    h2f DTYPE H F          every 16-bit pattern H of DTYPE (f16, bf16) and its f32 bits F
    f2h DTYPE F H          an f32 F (exact values, neighbours, midpoints and their neighbours
                           of every pattern, specials) and DTYPE's pattern H for it
    case NAME OP ARG ULPS  an op: OP is the library's name, ARG an integer (an axis) or a
                           float (a wrapped number), "-" for none; ULPS how far a result may be
                           from `out`, in units in the last place of the output's dtype at each
                           element (0: the same bits, any NaN for a NaN)
    in DTYPE RANK DIMS... VALUES...     its inputs, in order
    out DTYPE RANK DIMS... VALUES...    the reference
    native ULPS DTYPE RANK DIMS... VALUES...
                           (some cases) PyTorch's own 16-bit kernel's result, which a result
                           may be ULPS units away from, units at the output's scale: the unit in
                           the last place of the largest finite |value| of `out`
    end

Three kinds of case, so that the tests hold whatever the instruction set of the CPU that runs
this script (PyTorch picks its kernels by it: AVX-512, AVX2 or neither). A wrapped number
(add_scalar's 0.1) is rounded to the tensor's 16-bit dtype first, by PyTorch and the library
alike, and is that value below.
  exact    ops whose result is their operands' exact result rounded once (neg, abs, relu,
           floor, round, sqrt, reciprocal, add, sub, mul, div, maximum, the scalar ops, max
           reductions, casts, promotions): `out` is PyTorch's result, met bit for bit. The
           script checks that PyTorch's result is that rounding and fails if not.
  once     ops whose 16-bit kernels in PyTorch differ by instruction set (exp, log, tanh,
           sigmoid, gelu, sin, pow, sums and means, softmax, log_softmax, matmul): `out` is the
           op computed in f64 on the widened inputs and rounded once to the dtype, the value
           the library promises up to its f32 arithmetic (which can land one unit away): one
           unit. Where PyTorch has a 16-bit kernel for the op, a `native` line also holds the
           library to that kernel's result, within a tolerance at the output's scale (see
           NATIVE_ULPS).
  chain    several ops, each one's result rounded to its dtype (the library's rule), each
           computed as in `once` (vmixed's f32 ops by PyTorch, exactly rounded on every CPU);
           a unit of difference at one op could move a later one's result across a rounding
           boundary, and with these inputs none does: one unit.
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
HALF = (torch.float16, torch.bfloat16)
EXACT = 0
ONCE = 1
CHAIN = 1
# PyTorch's own 16-bit kernels against the library, in units in the last place of the largest
# |value| of the output. PyTorch's kernels differ by instruction set: bf16 gelu on AVX2
# approximates erf with absolute errors up to 2.5e-3 in the negative tail (80 units at a tiny
# element, 0.2 at the output's scale); elementwise ops and reductions measure at most 1 unit
# apart from the library on AVX-512, AVX2 and SSE4.2 machines, 4 leaves room.
NATIVE_ULPS = 4
# bf16 matmul without AVX-512 (and bf16 bmm on every instruction set) adds its products into a
# bf16 accumulator, rounding each of the k partial sums: a random walk of k roundings, measured
# 7 units apart from the f32-accumulating library for k = 96 (vmatmul), 3 for 64 (matmul), 2
# for 40 (bmm); 16 leaves room.
NATIVE_ULPS_MATMUL = 16
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
    mask = (1 << 8 * t.element_size()) - 1
    return ["%x" % (v & mask) for v in t.tolist()]


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


def tensor_line(t):
    dims = list(t.shape)
    name = dtype_name(t.dtype)
    return "%s %d %s %s" % (name, len(dims), " ".join(str(d) for d in dims),
                            " ".join(hexes(t, name)))


def round_once(t, dt):
    """An f64 tensor rounded once to dt. PyTorch goes from f64 to 16 bits through f32, two
    roundings; rounding to f32 towards the odd neighbour where inexact keeps the information a
    second rounding to 11 or 8 bits needs, so that one is exact."""
    if dt not in HALF:
        return t.to(dt)
    f = t.float()
    inexact = torch.isfinite(f) & (f.double() != t) & ((f.view(torch.int32) & 1) == 0)
    towards = torch.where(t > f.double(), float("inf"), -float("inf")).float()
    f = torch.where(inexact, torch.nextafter(f, towards), f)
    return f.to(dt)


def wide(fn, dt, *xs):
    """fn computed in f64 on the inputs, 16-bit ones widened, rounded once to dt."""
    return round_once(fn(*[x.double() if x.dtype in HALF else x for x in xs]), dt)


def native16(fn, dt, *xs):
    """PyTorch's own kernel for dt, or None where PyTorch 1.13 has none on the CPU."""
    try:
        y = fn(*xs)
    except RuntimeError:
        return None
    return y if y.dtype == dt else None


def run(fn, dt, *xs):
    """fn in PyTorch; where it is not implemented for dt, in f32 rounded once to dt."""
    try:
        return fn(*xs)
    except RuntimeError:
        return fn(*[x.float() if x.dtype == dt else x for x in xs]).to(dt)


def same_bits(a, b):
    """Equal bit patterns, any NaN matching any NaN."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    nan = torch.isnan(a)
    if not torch.equal(nan, torch.isnan(b)):
        return False
    bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a[~nan].view(bits), b[~nan].view(bits))


def dtype_name(dt):
    for k, v in DT.items():
        if v == dt:
            return k
    raise ValueError(dt)


def emit(name, op, arg, inputs, ref, ulps, native=None, native_ulps=NATIVE_ULPS):
    out.append("case %s %s %s %d" % (name, op, arg, ulps))
    for t in inputs:
        out.append("in " + tensor_line(t))
    out.append("out " + tensor_line(ref))
    if native is not None:
        out.append("native %d %s" % (native_ulps, tensor_line(native)))
    out.append("end")


def exact(name, op, arg, fn, dt, *xs):
    """A case whose reference is PyTorch's result, checked to be the exact rounding."""
    y = run(fn, dt, *xs)
    if not same_bits(y, wide(fn, y.dtype, *xs)):
        raise SystemExit("half_torch.py: %s: PyTorch's result is not the exactly rounded one"
                         % name)
    emit(name, op, arg, xs, y, EXACT)


def once(name, op, arg, fn, dt, *xs, native_ulps=NATIVE_ULPS):
    """A case whose reference is the f64 result rounded once, with PyTorch's own kernel's."""
    emit(name, op, arg, xs, wide(fn, dt, *xs), ONCE, native16(fn, dt, *xs), native_ulps)


UNARY_EXACT = {
    "neg": torch.neg, "abs": torch.abs, "sqrt": torch.sqrt, "relu": torch.relu,
    "reciprocal": torch.reciprocal, "floor": torch.floor, "round": torch.round,
}
UNARY_ONCE = {
    "exp": torch.exp, "log": torch.log, "tanh": torch.tanh, "sigmoid": torch.sigmoid,
    "gelu": torch.nn.functional.gelu, "sin": torch.sin,
}
BINARY_EXACT = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
    "maximum": torch.maximum,
}
BINARY_ONCE = {"pow": torch.pow}


def ops(name, g):
    dt = DT[name]

    def rnd(*dims, lo=-2.0, hi=2.0):
        return (torch.rand(*dims, generator=g) * (hi - lo) + lo).to(dt)

    for op in ("neg", "abs", "exp", "log", "sqrt", "tanh", "sigmoid", "relu", "gelu", "sin",
               "reciprocal", "floor", "round"):
        lo = 0.05 if op in ("log", "sqrt", "reciprocal") else -3.0
        for dims in ((7, 13), (1,), (0, 3)):
            x = rnd(*dims, lo=lo, hi=3.0)
            n = "%s_%s_%s" % (op, name, "x".join(map(str, dims)))
            if op in UNARY_EXACT:
                exact(n, op, "-", UNARY_EXACT[op], dt, x)
            else:
                once(n, op, "-", UNARY_ONCE[op], dt, x)
    for op in ("add", "sub", "mul", "div", "maximum", "pow"):
        lo = 0.1 if op == "pow" else -3.0
        for da, db in (((7, 13), (7, 13)), ((7, 1), (1, 13)), ((5,), (1,))):
            a, b = rnd(*da, lo=lo, hi=3.0), rnd(*db, lo=-2.0 if op != "div" else 0.5, hi=3.0)
            n = "%s_%s" % (op, name)
            if op in BINARY_EXACT:
                exact(n, op, "-", BINARY_EXACT[op], dt, a, b)
            else:
                once(n, op, "-", BINARY_ONCE[op], dt, a, b)

    def sc(v):
        """A wrapped number as PyTorch and the library use it with a 16-bit tensor: rounded to
        the tensor's dtype first (0.1 as f16 is 0.0999755859375)."""
        return torch.tensor(v, dtype=torch.float64).to(dt).item()

    x = rnd(9, 11)
    exact("add_scalar_%s" % name, "add_scalar", "0.1", lambda t: t + sc(0.1), dt, x)
    exact("mul_scalar_%s" % name, "mul_scalar", "3", lambda t: t * sc(3.0), dt, x)
    # reductions of positive values (no cancellation: the order of the f32 sums stays within
    # one unit of the 16-bit result)
    x = rnd(6, 300, lo=0.0, hi=1.0)
    once("sum_all_%s" % name, "sum", "-1", lambda t: t.sum(), dt, x)
    once("sum_1_%s" % name, "sum", "1", lambda t: t.sum(1), dt, x)
    once("mean_1_%s" % name, "mean", "1", lambda t: t.mean(1), dt, x)
    x = rnd(6, 300)
    exact("max_1_%s" % name, "max", "1", lambda t: t.amax(1), dt, x)
    once("softmax_1_%s" % name, "softmax", "1", lambda t: t.softmax(1), dt, x)
    once("log_softmax_1_%s" % name, "log_softmax", "1", lambda t: t.log_softmax(1), dt, x)
    a, b = rnd(17, 64, lo=0.0, hi=1.0), rnd(64, 23, lo=0.0, hi=1.0)
    once("matmul_%s" % name, "matmul", "-", torch.matmul, dt, a, b,
         native_ulps=NATIVE_ULPS_MATMUL)
    a, b = rnd(3, 5, 40, lo=0.0, hi=1.0), rnd(3, 40, 6, lo=0.0, hi=1.0)
    once("bmm_%s" % name, "matmul", "-", torch.matmul, dt, a, b,
         native_ulps=NATIVE_ULPS_MATMUL)
    # casts, in and out; fused chains round each op's result
    x = torch.rand(8, 16, generator=g) * 200 - 100
    exact("cast_f32_%s" % name, "cast", name, lambda t: t.to(dt), dt, x)
    exact("cast_%s_f32" % name, "cast", "f32", lambda t: t.float(), dt, x.to(dt))
    exact("cast_%s_i32" % name, "cast", "i32", lambda t: t.to(torch.int32), dt, x.to(dt))

    def r(fn, *xs):
        return wide(fn, dt, *xs)

    x = rnd(5, 33)
    a = r(lambda t: t + sc(0.3), r(lambda t: t * sc(1.7), x))
    emit("chain_%s" % name, "chain", "-", [x],
         r(torch.mul, r(torch.tanh, r(torch.sub, r(torch.exp, a), x)), x), CHAIN)
    # rows long enough for the kernels that work 16 lanes at a time: every op of a chain
    # rounded (tb's vector set), a row broadcast, mixed with f32 through casts, reductions,
    # softmax, and a matmul big enough to pack its operands
    x, y, c = rnd(16, 1024), rnd(16, 1024), rnd(16, 1)
    a = r(lambda t: t + sc(0.3), r(lambda t: t * sc(1.7), x))
    b = r(torch.sub, r(torch.exp, a), y)
    n1 = r(torch.div, r(torch.relu, b), r(lambda t: t + sc(1.0), r(torch.abs, x)))
    n2 = r(torch.mul, r(torch.sqrt, r(torch.abs, y)), c)
    emit("vchain_%s" % name, "vchain", "-", [x, y, c], r(torch.maximum, n1, r(torch.neg, n2)),
         CHAIN)
    f = torch.rand(16, 1024, generator=g) * 4 - 2
    fb = f.view(torch.int32)  # NaNs whose low bits would carry a rounding into the exponent
    fb[0, 3], fb[1, 4], fb[2, 5], fb[3, 6] = 0x7F800001, 0x7FFFFFFF, -1, 0x7F80FFFF
    emit("vmixed_%s" % name, "vmixed", name, [x, f], (x.float() * f + 1.0).to(dt), CHAIN)
    x = rnd(8, 2048, lo=0.0, hi=1.0)
    once("vsum_1_%s" % name, "sum", "1", lambda t: t.sum(1), dt, x)
    x = rnd(8, 2048)
    exact("vmax_1_%s" % name, "max", "1", lambda t: t.amax(1), dt, x)
    once("vsoftmax_1_%s" % name, "softmax", "1", lambda t: t.softmax(1), dt, x)
    a, b = rnd(70, 96, lo=0.0, hi=1.0), rnd(96, 80, lo=0.0, hi=1.0)
    once("vmatmul_%s" % name, "matmul", "-", torch.matmul, dt, a, b,
         native_ulps=NATIVE_ULPS_MATMUL)
    # the same 16 lanes at a time through overflow, subnormal results, NaN and infinities
    spec = ([65504.0, 65520.0, 6.0e-8, 3.0e-8, 1.0e-5, -0.0, 3.0e38, 1.0e-39, 1.0e-41]
            + [float("nan"), float("inf"), -float("inf"), 2.5, -7.0, 0.1, 1000.0])
    a = torch.tensor(spec * 64, dtype=torch.float32).reshape(16, 64)
    a = (a * (torch.rand(16, 64, generator=g) * 0.5 + 0.75)).to(dt)
    b = torch.tensor([1.0001, 0.5, -2.0, 0.75, 1.5, 0.0078125, -1.0, 3.0] * 128).reshape(16, 64)
    b = b.to(dt)
    exact("vspecial_mul_%s" % name, "mul", "-", torch.mul, dt, a, b)
    e = (torch.rand(16, 64, generator=g) * 32 - 20).to(dt)
    e[3, 5], e[7, 9], e[11, 1] = float("nan"), float("inf"), -float("inf")
    once("vspecial_exp_%s" % name, "exp", "-", torch.exp, dt, e)
    # overflow to infinity, NaN
    big = torch.tensor([300.0, -300.0, 60000.0, 1e38, 2.0], dtype=torch.float32).to(dt)
    exact("overflow_mul_%s" % name, "mul", "-", torch.mul, dt, big, big)
    once("overflow_exp_%s" % name, "exp", "-", torch.exp, dt, big)
    odd = torch.tensor([-1.0, 0.0, float("nan"), float("inf"), -float("inf")]).to(dt)
    once("nan_log_%s" % name, "log", "-", torch.log, dt, odd)
    once("nan_sum_%s" % name, "sum", "-1", lambda t: t.sum(), dt, odd)
    # promotion: with a rank-0 f32 tensor the 16-bit dtype wins; with an i64 tensor too
    x = rnd(4, 6)
    s0 = torch.tensor(0.375, dtype=torch.float32)
    exact("promote_0d_%s" % name, "add", "-", torch.add, dt, x, s0)
    i = torch.arange(6, dtype=torch.int64)
    exact("promote_i64_%s" % name, "mul", "-", torch.mul, dt, x, i)


def main():
    for name in ("f16", "bf16"):
        conversions(name)
    g = torch.Generator().manual_seed(16)
    for name in ("f16", "bf16"):
        ops(name, g)
    a = (torch.rand(3, 4, generator=g) * 4 - 2).to(torch.float16)
    b = (torch.rand(3, 4, generator=g) * 4 - 2).to(torch.bfloat16)
    exact("promote_f16_bf16", "add", "-", torch.add, torch.float32, a, b)
    sys.stdout.write("\n".join(out) + "\n")


main()
