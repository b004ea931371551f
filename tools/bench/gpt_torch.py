"""The PyTorch twin of examples/gpt.c: the same character-level GPT (4 layers, 4 heads, 128
dims, blocks of 64, batches of 12, no dropout, tied output layer), the same data (the
plain-text files of Debian's fortunes package in name order, 90% for training), the same
batches (offsets from a splitmix64 stream seeded with 1337; held-out batches from one seeded
with 42), the same AdamW (lr 1e-3, betas (0.9, 0.99), weight decay 0.1 on every parameter)
and, with --init FILE (written by ./gpt --save-init FILE), the same initial weights.

Usage: /usr/bin/python3 tools/bench/gpt_torch.py [--iters N] [--eval-every N] [--data DIR]
                                                 [--init FILE] [--threads T]
Prints the lines examples/gpt.c prints. Standard library and torch only.
"""
import argparse
import json
import math
import os
import struct
import sys
import time

import torch
import torch.nn.functional as F

LAYERS, HEADS, EMBD, BLOCK, BATCH, EVAL_BATCH = 4, 4, 128, 64, 12, 20
MASK = (1 << 64) - 1


def splitmix64(state):
    state[0] = (state[0] + 0x9E3779B97F4A7C15) & MASK
    z = state[0]
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def load_corpus(folder):
    names = sorted(n for n in os.listdir(folder) if not n.startswith(".") and "." not in n)
    data = b"".join(open(os.path.join(folder, n), "rb").read() for n in names)
    chars = sorted(set(data))
    index = {c: i for i, c in enumerate(chars)}
    ids = torch.tensor([index[c] for c in data], dtype=torch.int64)
    return ids, len(chars), len(data) * 9 // 10


def batch(ids, lo, hi, state):
    xs, ys = [], []
    for _ in range(BATCH):
        at = lo + splitmix64(state) % (hi - lo - BLOCK - 1)
        xs.append(ids[at:at + BLOCK])
        ys.append(ids[at + 1:at + BLOCK + 1])
    return torch.stack(xs), torch.stack(ys)


def load_safetensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, v in header.items():
        if name == "__metadata__":
            continue
        a, b = v["data_offsets"]
        t = torch.frombuffer(bytearray(raw[8 + n + a:8 + n + b]), dtype=torch.float32)
        out[name] = t.reshape(v["shape"]).clone()
    return out


def make_params(vocab, init):
    p = {}
    proj = 0.02 / math.sqrt(2 * LAYERS)

    def add(name, shape, kind):
        if init is not None:
            t = init[name].clone()
        elif kind == "ones":
            t = torch.ones(shape)
        elif kind == "zeros":
            t = torch.zeros(shape)
        else:
            t = torch.randn(shape) * (proj if kind == "proj" else 0.02)
        p[name] = t.requires_grad_(True)

    add("wte", (vocab, EMBD), "normal")
    add("wpe", (BLOCK, EMBD), "normal")
    for l in range(LAYERS):
        h = "h.%d." % l
        add(h + "ln_1.weight", (EMBD,), "ones")
        add(h + "ln_1.bias", (EMBD,), "zeros")
        add(h + "attn.c_attn.weight", (3 * EMBD, EMBD), "normal")
        add(h + "attn.c_attn.bias", (3 * EMBD,), "zeros")
        add(h + "attn.c_proj.weight", (EMBD, EMBD), "proj")
        add(h + "attn.c_proj.bias", (EMBD,), "zeros")
        add(h + "ln_2.weight", (EMBD,), "ones")
        add(h + "ln_2.bias", (EMBD,), "zeros")
        add(h + "mlp.c_fc.weight", (4 * EMBD, EMBD), "normal")
        add(h + "mlp.c_fc.bias", (4 * EMBD,), "zeros")
        add(h + "mlp.c_proj.weight", (EMBD, 4 * EMBD), "proj")
        add(h + "mlp.c_proj.bias", (EMBD,), "zeros")
    add("ln_f.weight", (EMBD,), "ones")
    add("ln_f.bias", (EMBD,), "zeros")
    return p


def forward_loss(p, x, y):
    causal = torch.ones(BLOCK, BLOCK, dtype=torch.bool).tril()
    h = p["wte"][x] + p["wpe"]
    for l in range(LAYERS):
        q = "h.%d." % l
        a = F.layer_norm(h, (EMBD,), p[q + "ln_1.weight"], p[q + "ln_1.bias"], 1e-5)
        qkv = F.linear(a, p[q + "attn.c_attn.weight"], p[q + "attn.c_attn.bias"])
        qq, kk, vv = (t.reshape(BATCH, BLOCK, HEADS, EMBD // HEADS).transpose(1, 2)
                      for t in qkv.split(EMBD, dim=2))
        s = (qq @ kk.transpose(-2, -1)) / math.sqrt(EMBD // HEADS)
        s = s.masked_fill(~causal, float("-inf"))
        a = (torch.softmax(s, -1) @ vv).transpose(1, 2).reshape(BATCH, BLOCK, EMBD)
        h = h + F.linear(a, p[q + "attn.c_proj.weight"], p[q + "attn.c_proj.bias"])
        m = F.layer_norm(h, (EMBD,), p[q + "ln_2.weight"], p[q + "ln_2.bias"], 1e-5)
        m = F.gelu(F.linear(m, p[q + "mlp.c_fc.weight"], p[q + "mlp.c_fc.bias"]))
        h = h + F.linear(m, p[q + "mlp.c_proj.weight"], p[q + "mlp.c_proj.bias"])
    h = F.layer_norm(h, (EMBD,), p["ln_f.weight"], p["ln_f.bias"], 1e-5)
    logits = F.linear(h, p["wte"])
    return F.cross_entropy(logits.reshape(BATCH * BLOCK, -1), y.reshape(-1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--data", default="/usr/share/games/fortunes")
    ap.add_argument("--init", default=None)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1337)
    ids, vocab, split = load_corpus(a.data)
    p = make_params(vocab, load_safetensors(a.init) if a.init else None)
    opt = torch.optim.AdamW(list(p.values()), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)
    print("gpt_torch: %d layers, %d heads, %d dims, blocks of %d, batches of %d, %d threads; "
          "%d characters (%d distinct), %d held out" %
          (LAYERS, HEADS, EMBD, BLOCK, BATCH, a.threads, len(ids), vocab, len(ids) - split))
    state, train_sum, train_n, t0 = [1337], 0.0, 0, time.perf_counter()
    for it in range(1, a.iters + 1):
        x, y = batch(ids, 0, split, state)
        loss = forward_loss(p, x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        train_sum += loss.item()
        train_n += 1
        if it % a.eval_every == 0 or it == a.iters:
            with torch.no_grad():
                es, total = [42], 0.0
                for _ in range(EVAL_BATCH):
                    ex, ey = batch(ids, split, len(ids), es)
                    total += forward_loss(p, ex, ey).item()
            print("iter %d: train loss %.4f, held-out loss %.4f, %.1f ms per iteration" %
                  (it, train_sum / train_n, total / EVAL_BATCH,
                   (time.perf_counter() - t0) * 1e3 / train_n))
            sys.stdout.flush()
            train_sum, train_n, t0 = 0.0, 0, time.perf_counter()


main()
