#!/usr/bin/env python3
"""PyTorch eager beside the benchmark: a small server on stdin and stdout.

The benchmark (tools/bench.sh) starts it as

    /usr/bin/python3 tools/bench/torch_peer.py THREADS

with MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=68719476736 OMP_WAIT_POLICY=PASSIVE and
OMP_NUM_THREADS, OPENBLAS_NUM_THREADS set to THREADS, and speaks one line per request and answer:

    (at start)                          -> "ready torch V numpy V threads N" or "unavailable WHY"
    setup CASE OUT NAME=PATH:DIMS ...   -> "ok N" | "error WHY"
        loads the inputs (raw little-endian float32 files; DIMS like 4096x4096), runs the case
        once (the warm-up; a training case runs its check steps instead) and writes its result
        to OUT (raw float32, N elements)
    run                                 -> "time SECONDS FAULTS"
        one call of the case, timed with time.perf_counter (the result is dropped inside the
        timed region, as the benchmark releases ours); FAULTS: its minor page faults
    quit

Each case is what a PyTorch user writes, run under torch.inference_mode() (the training
case, mlp_train, leaves it for its step) with the garbage collector off while timing (as
timeit does). Standard library, numpy and torch only.
"""

import gc
import resource
import sys
import time


def answer(text):
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def make_case(torch, name, t):
    """The case's call on the loaded inputs `t` (a dict of tensors)."""
    F = torch.nn.functional
    if name == "chain8":
        x = t["x"]
        # the eight ops of the benchmark's chain, in its order
        return lambda: torch.exp(-torch.abs(torch.relu(x * 1.5 + 0.5) * x - 0.25))
    if name == "add":
        x, y = t["x"], t["y"]
        return lambda: x + y
    if name == "gates":
        x, y = t["x"], t["y"]
        return lambda: torch.sigmoid(x) * torch.tanh(y)
    if name == "sum":
        x = t["x"]
        return lambda: torch.sum(x)
    if name == "max":
        x = t["x"]
        return lambda: torch.max(x)
    if name == "row_sums":
        x = t["x"]
        return lambda: torch.sum(x, 1)
    if name == "softmax":
        x = t["x"]
        return lambda: torch.softmax(x, 1)
    if name == "layer_norm":
        x, w, b = t["x"], t["w"], t["b"]
        shape = (x.shape[1],)
        return lambda: F.layer_norm(x, shape, w, b, 1e-5)
    if name == "matmul":
        a, b = t["a"], t["b"]
        return lambda: torch.mm(a, b)
    if name == "mlp":
        # nn.Linear's layout: the weight is [out, in] (ours is [in, out]); F.linear is addmm
        x = t["x"]
        layers = [(t["w%d" % i].t().contiguous(), t["b%d" % i]) for i in range(3)]

        def mlp():
            h = x
            for i, (w, b) in enumerate(layers):
                h = F.linear(h, w, b)
                h = torch.relu(h) if i < 2 else torch.softmax(h, 1)
            return h

        return mlp
    if name == "mlp_train":
        return make_train(torch, t)
    if name == "conv2d":
        return make_conv(torch, t)
    if name == "replay":
        x, r0 = t["x"], t["r0"]

        def replay():
            r = r0
            for _ in range(100):
                r = torch.amax(r + x, 1, keepdim=True)
            return r

        return replay
    raise ValueError("unknown case " + name)


def make_conv(torch, t):
    """F.conv2d on x [N, C, H, W] and w [O, C, K, K] (sent flat, with their sizes in cfg: N C
    H O K pad backward); with backward, also the gradients of x and w by autograd with r as
    the gradient of the output (the setup's result is the forward output either way)."""
    F = torch.nn.functional
    n, c, h, o, k, pad, backward = (int(v) for v in t["cfg"][:7].tolist())
    x = t["x"].reshape(n, c, h, h)
    w = t["w"].reshape(o, c, k, k)
    if not backward:
        return lambda: F.conv2d(x, w, padding=pad)
    with torch.inference_mode(False):
        xg = x.clone().requires_grad_()
        wg = w.clone().requires_grad_()
        r = t["r"].clone().reshape(n, o, h + 2 * pad - k + 1, h + 2 * pad - k + 1)

    def step():
        with torch.inference_mode(False):
            y = F.conv2d(xg, wg, padding=pad)
            gx, gw = torch.autograd.grad(y, (xg, wg), r)
            return y.detach()

    return step


def make_train(torch, t):
    """One training step of the MLP as a PyTorch user writes it: nn.Linear's layout and
    initial values (ours are [in, out]: transposed here), F.cross_entropy on integer targets,
    loss.backward(), torch.optim.AdamW(lr=1e-3) with its defaults. The setup runs `steps`
    steps and gives their losses and then the parameters in our layout."""
    F = torch.nn.functional
    # the server runs under inference_mode: training needs autograd, and tensors of its own
    # (inference tensors cannot be saved for backward)
    with torch.inference_mode(False):
        x = t["x"].clone()
        y = t["y"].clone().long()
        params = []
        for i in range(3):
            params.append(t["w%d" % i].clone().t().contiguous().requires_grad_())
            params.append(t["b%d" % i].clone().requires_grad_())
        opt = torch.optim.AdamW(params, lr=1e-3)
    steps = int(t["steps"].item())

    def step():
        with torch.inference_mode(False):
            opt.zero_grad(set_to_none=True)
            h = x
            for i in range(3):
                h = F.linear(h, params[2 * i], params[2 * i + 1])
                if i < 2:
                    h = torch.relu(h)
            loss = F.cross_entropy(h, y)
            loss.backward()
            opt.step()
            return loss.detach()

    def check():
        losses = [step() for _ in range(steps)]
        with torch.inference_mode(False):
            ours = [p.detach().t() if p.dim() == 2 else p.detach() for p in params]
            return torch.cat([torch.stack(losses)] + [p.reshape(-1) for p in ours])

    step.check = check
    return step


def load(np, torch, spec):
    name, rest = spec.split("=", 1)
    path, dims = rest.rsplit(":", 1)
    shape = tuple(int(d) for d in dims.split("x"))
    data = np.fromfile(path, dtype="<f4")
    if data.size != int(np.prod(shape)):
        raise ValueError("%s: %d floats, expected %s" % (path, data.size, dims))
    return name, torch.from_numpy(data.reshape(shape).astype(np.float32, copy=False))


def main():
    try:
        import numpy as np
        import torch
    except Exception as e:  # not importable: the benchmark notes it and goes on
        answer("unavailable PyTorch cannot be imported: %s" % str(e).replace("\n", " "))
        return 0
    threads = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    torch.set_num_threads(threads)
    answer(
        "ready torch %s numpy %s threads %d"
        % (torch.__version__, np.__version__, torch.get_num_threads())
    )
    call = None
    with torch.inference_mode():
        for line in sys.stdin:
            words = line.split()
            if not words:
                continue
            if words[0] == "quit":
                break
            if words[0] == "setup":
                call = None
                gc.collect()
                try:
                    inputs = dict(load(np, torch, spec) for spec in words[3:])
                    call = make_case(torch, words[1], inputs)
                    y = getattr(call, "check", call)()
                    out = y.contiguous().numpy().astype(np.float32, copy=False)
                    out.tofile(words[2])
                    answer("ok %d" % out.size)
                except Exception as e:
                    call = None
                    answer("error %s" % str(e).replace("\n", " "))
            elif words[0] == "run":
                if call is None:
                    answer("error no case")
                    continue
                gc.disable()
                f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                t0 = time.perf_counter()
                y = call()
                del y
                t1 = time.perf_counter()
                f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                gc.enable()
                answer("time %.9f %d" % (t1 - t0, f1 - f0))
            else:
                answer("error unknown request " + words[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
