#!/usr/bin/python3
"""examples/train_cnn.c as a PyTorch user writes it: the same data (Debian's
dataset-fashion-mnist, normalised with the training set's mean 0.2860 and std 0.3530), the same
model (conv 5x5 32 pad 2 -> ReLU -> max-pool 2 -> conv 5x5 64 pad 2 -> ReLU -> max-pool 2 ->
dense 1024 -> ReLU -> dropout 0.4 -> dense 10, PyTorch's default initialisation), AdamW with
PyTorch's defaults at lr 1e-3 times 0.7 after every epoch, cross-entropy, shuffled minibatches
of 128 (full batches only). One line per epoch in the example's format, so the two can be read
side by side.

    /usr/bin/python3 tools/bench/train_cnn_torch.py [EPOCHS] [--data DIR] [--threads N]
        [--images N]

Run it with the allocator settings of tools/bench.sh (MALLOC_MMAP_MAX_=0
MALLOC_TRIM_THRESHOLD_=68719476736 OMP_WAIT_POLICY=PASSIVE). --threads defaults to the number of cores this process may use."""
import argparse
import os
import sys
import time

# the data loading of the MLP's script, which lies beside this one
from train_mnist_torch import load_set


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("epochs", nargs="?", type=int, default=1)
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--images", type=int, default=0)
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        sys.exit("train_cnn_torch: PyTorch is not importable (apt-get install python3-torch)")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    train_x, train_y = load_set(torch, args.data, "train")
    test_x, test_y = load_set(torch, args.data, "t10k")
    if args.images > 0:
        train_x, train_y = train_x[:args.images], train_y[:args.images]
    train_x = train_x.reshape(-1, 1, 28, 28)
    test_x = test_x.reshape(-1, 1, 28, 28)
    print("Fashion-MNIST: %d training and %d test images; CNN conv5x5x32-pool-conv5x5x64-pool-"
          "1024-10, AdamW, batch 128, on PyTorch %s (%d threads)"
          % (len(train_x), len(test_x), torch.__version__, args.threads))
    nn = torch.nn
    model = nn.Sequential(nn.Conv2d(1, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(3136, 1024), nn.ReLU(), nn.Dropout(0.4),
                          nn.Linear(1024, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = 128
    n = len(train_x)
    for epoch in range(1, args.epochs + 1):
        if epoch > 1:
            for group in opt.param_groups:
                group["lr"] *= 0.7
        model.train()
        order = torch.randperm(n)
        t0 = time.perf_counter()
        loss_sum = 0.0
        right = 0
        seen = 0
        for at in range(0, n - batch + 1, batch):
            idx = order[at:at + batch]
            xb, yb = train_x[idx], train_y[idx]
            opt.zero_grad()
            logits = model(xb)
            loss = torch.nn.functional.cross_entropy(logits, yb)
            loss.backward()
            opt.step()
            loss_sum += loss.item() * batch
            right += int((logits.argmax(1) == yb).sum())
            seen += batch
        seconds = time.perf_counter() - t0
        model.eval()
        with torch.no_grad():
            right_test = sum(int((model(test_x[i:i + 1000]).argmax(1) == test_y[i:i + 1000]).sum())
                             for i in range(0, len(test_x), 1000))
            test_acc = right_test / len(test_x)
        print("epoch %d/%d  loss %.4f  train accuracy %.4f  test accuracy %.4f  %.0f images/s  "
              "%.2f s" % (epoch, args.epochs, loss_sum / seen, right / seen, test_acc,
                          seen / seconds, seconds), flush=True)


if __name__ == "__main__":
    main()
