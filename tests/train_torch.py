"""PyTorch's side of tests/test_train.c: the same small problems, printed for comparison.

Usage: /usr/bin/python3 tests/train_torch.py optim | losses
Every number is printed with %.17g. Standard library and torch only.
"""
import math
import sys

import torch

STEPS = 20

# (kind, kwargs, label_smoothing); the same table as CONFIGS in tests/test_train.c
CONFIGS = [
    ("sgd", dict(lr=0.1), 0.0),
    ("sgd", dict(lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01), 0.0),
    ("sgd", dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.001), 0.0),
    ("sgd", dict(lr=0.1, momentum=0.5, maximize=True), 0.0),
    ("adam", dict(lr=0.01), 0.0),
    ("adam", dict(lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1), 0.0),
    ("adamw", dict(lr=0.01), 0.1),
    ("adamw", dict(lr=0.02, weight_decay=0.1, maximize=True), 0.1),
]


def problem(dtype):
    w = torch.tensor([math.sin(i + 1) * 0.5 for i in range(12)], dtype=dtype).reshape(3, 4)
    b = torch.tensor([math.cos(i + 1) * 0.1 for i in range(4)], dtype=dtype)
    x = torch.tensor([math.sin(0.3 * k + 0.1) for k in range(15)], dtype=dtype).reshape(5, 3)
    y = torch.tensor([(k * 7) % 4 for k in range(5)], dtype=torch.int64)
    return w, b, x, y


def run_optim(cfg, dtype):
    kind, kw, smooth = CONFIGS[cfg]
    w, b, x, y = problem(dtype)
    w.requires_grad_(True)
    b.requires_grad_(True)
    cls = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[kind]
    opt = cls([w, b], **kw)
    out = []
    for step in range(STEPS):
        if step == 10:
            for g in opt.param_groups:
                g["lr"] *= 0.5
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(x @ w + b, y, label_smoothing=smooth)
        loss.backward()
        opt.step()
        out.append(loss.item())
        out.extend(w.detach().reshape(-1).tolist())
        out.extend(b.detach().tolist())
    return out


def run_losses(dtype):
    """Values and gradients of each loss on fixed inputs (see losses() in test_train.c)."""
    out = []
    logits = torch.tensor([math.sin(0.7 * i) * 2 for i in range(4 * 5 * 3)], dtype=dtype)
    logits = logits.reshape(4, 5, 3).requires_grad_(True)
    tgt3 = torch.tensor([(i * 3) % 5 for i in range(4 * 3)], dtype=torch.int64).reshape(4, 3)
    probs = torch.softmax(torch.tensor([math.cos(0.4 * i) for i in range(4 * 5 * 3)],
                                       dtype=dtype).reshape(4, 5, 3), 1)
    pred = torch.tensor([math.sin(0.9 * i) for i in range(6)], dtype=dtype).reshape(2, 3)
    pred.requires_grad_(True)
    want = torch.tensor([math.cos(0.5 * i) for i in range(6)], dtype=dtype).reshape(2, 3)
    cases = []
    for red in ("mean", "sum", "none"):
        for smooth in (0.0, 0.25):
            cases.append(lambda red=red, smooth=smooth: torch.nn.functional.cross_entropy(
                logits, tgt3, reduction=red, label_smoothing=smooth))
            cases.append(lambda red=red, smooth=smooth: torch.nn.functional.cross_entropy(
                logits, probs, reduction=red, label_smoothing=smooth))
        cases.append(lambda red=red: torch.nn.functional.nll_loss(
            torch.log_softmax(logits, 1), tgt3, reduction=red))
        cases.append(lambda red=red: torch.nn.functional.mse_loss(pred, want, reduction=red))
    for case in cases:
        logits.grad = None
        pred.grad = None
        v = case()
        # the seed of a non-reduced loss: 1, 2, 3, ... over its elements
        seed = torch.arange(1, v.numel() + 1, dtype=dtype).reshape(v.shape)
        (v * seed).sum().backward()
        out.extend(v.detach().reshape(-1).tolist())
        g = logits.grad if logits.grad is not None else pred.grad
        out.extend(g.reshape(-1).tolist())
    return out


def main():
    what = sys.argv[1] if len(sys.argv) > 1 else "optim"
    for dtype, name in ((torch.float64, "f64"), (torch.float32, "f32")):
        if what == "optim":
            for cfg in range(len(CONFIGS)):
                vals = run_optim(cfg, dtype)
                print("optim %d %s %d %s" % (cfg, name, len(vals),
                                             " ".join("%.17g" % v for v in vals)))
        else:
            vals = run_losses(dtype)
            print("losses %s %d %s" % (name, len(vals), " ".join("%.17g" % v for v in vals)))


if __name__ == "__main__":
    main()
