#!/usr/bin/python3
"""A training step of torchvision's ResNet-18 through tools/tb_fx.py or in PyTorch eager: the
benchmark's fx_train_resnet18 rows (tools/bench/models.py).

    /usr/bin/python3 tools/bench/fx_train.py DEVICE [--batch N] [--size N] [--steps N]
        [--threads N]

DEVICE is "torch" (PyTorch eager) or one of the library's devices ("native:0", "opencl:0").
A step: the forward in training mode, cross entropy against fixed labels, backward, and
torch.optim.SGD's update (momentum 0.9). Prints "step_ms M", the median of --steps steps after
three warm-up steps (the library's first call compiles), and "loss L" of the first step. On a
library device the first step's loss is also checked against PyTorch's on a copy of the model
(exit 1 when they differ by more than 1e-4 of its size). Run PyTorch with tools/bench.sh's
allocator settings (MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=68719476736
OMP_WAIT_POLICY=PASSIVE). --threads defaults to the cores this process may use.
"""
import argparse
import copy
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("device")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    a = ap.parse_args()
    if a.batch < 1 or a.size < 32 or a.steps < 1:
        ap.error("--batch and --steps at least 1, --size at least 32")
    import torch
    import torch.nn.functional as F
    import torchvision
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = torchvision.models.resnet18().train()
    x = torch.randn(a.batch, 3, a.size, a.size)
    labels = torch.randint(0, 1000, (a.batch,))
    want = None
    if a.device == "torch":
        step = model
    else:
        import tb_fx
        want = F.cross_entropy(copy.deepcopy(model)(x), labels).item()
        step = tb_fx.compile(model, [x], device=a.device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    times, first = [], None
    for i in range(a.steps + 3):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(step(x), labels)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        if first is None:
            first = loss.item()
    print("loss %.6f" % first)
    print("step_ms %.3f" % (statistics.median(times[3:]) * 1e3))
    if want is not None and abs(first - want) > 1e-4 * max(abs(want), 1e-6):
        print("fx_train: the first loss %.7g is not PyTorch's %.7g" % (first, want),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
