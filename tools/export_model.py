"""Exports a model of torchvision (or a torch.nn.TransformerEncoder) to safetensors: its
state_dict under PyTorch's names, an input and PyTorch's output for it, for
examples/models.c to rebuild the model, run it and compare.

Usage: /usr/bin/python3 tools/export_model.py MODEL OUT.safetensors [--batch N] [--size S]
                                              [--seed K] [--time REPS]
  MODEL   resnet18, resnet50, mobilenet_v2, squeezenet1_0 (input [N, 3, S, S], eval mode) or
          encoder (torch.nn.TransformerEncoder: d_model 128, 4 heads, feed-forward 512, 2
          layers, ReLU, post-norm, batch first; input [N, S, 128])
  --batch N   batch (default 2); --size S: image side or sequence length (default 224; 64
              for encoder); --seed K: torch.manual_seed before the model and the input are
              made (default 0; nothing is downloaded: weights are torchvision's random
              initialisation, batch norm's running statistics drawn so that folding them
              matters); --time REPS: also time PyTorch's forward (median of REPS, after one
              warm-up), store it as metadata "torch_ms" and print "torch_ms X"; --threads T:
              PyTorch's threads (default: the CPUs online); --time-only: time it (REPS of
              --time, default 5), print "torch_ms X" and write nothing (OUT is not
              touched); --tb-fx DEVICE: instead of timing PyTorch and writing OUT, run the
              model through tools/tb_fx.py on DEVICE (e.g. native:0), check its output
              against PyTorch's and print "tb_fx_ms X first_s Y error Z" (the median of the
              REPS of --time cached calls, the first call with its compile, the error
              relative to the output's scale).
Writes the tensors in f32 and the metadata "model", "batch", "size", "seed". Standard
library and torch only; exit status 2 when torch or torchvision cannot be imported.
"""
import argparse
import json
import os
import struct
import sys
import time

try:
    import torch
except Exception as e:  # noqa: BLE001 (any failure to import means no torch here)
    print("export_model: torch is not available: %s" % e, file=sys.stderr)
    sys.exit(2)

CNNS = ("resnet18", "resnet50", "mobilenet_v2", "squeezenet1_0")


def make(name, batch, size):
    if name == "encoder":
        layer = torch.nn.TransformerEncoderLayer(128, 4, 512, dropout=0.0, batch_first=True)
        model = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        return model, torch.randn(batch, size, 128)
    try:
        import torchvision
    except Exception as e:  # noqa: BLE001
        print("export_model: torchvision is not available: %s" % e, file=sys.stderr)
        sys.exit(2)
    model = getattr(torchvision.models, name)()
    for m in model.modules():  # statistics a trained network would have, not 0 and 1
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.2, 0.2)
            m.running_var.uniform_(0.5, 1.5)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.2, 0.2)
    return model, torch.rand(batch, 3, size, size)


def tb_fx_time(model, x, want, device, reps):
    """The model through tools/tb_fx.py on `device`: prints its times and error."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import tb_fx
    t0 = time.perf_counter()
    f = tb_fx.compile(model, [x], device=device, strict=True)
    got = f(x)
    first = time.perf_counter() - t0
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f(x)
        times.append(time.perf_counter() - t0)
    times.sort()
    err = ((got - want).abs().max() / want.abs().max()).item()
    print("tb_fx_ms %.3f first_s %.3f error %.1e" % (1e3 * times[len(times) // 2], first, err))


def save(path, tensors, meta):
    """safetensors: an 8-byte little-endian header length, the JSON header, the data."""
    header, blobs, offset = {"__metadata__": meta}, [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous()
        dtype = {torch.float32: "F32", torch.int64: "I64"}[t.dtype]
        data = t.numpy().tobytes()
        header[name] = {"dtype": dtype, "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", choices=CNNS + ("encoder",))
    ap.add_argument("out")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--size", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--time", type=int, default=0)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--time-only", action="store_true")
    ap.add_argument("--tb-fx", default="")
    a = ap.parse_args()
    if a.time_only and a.time <= 0:
        a.time = 5
    torch.set_num_threads(a.threads)
    size = a.size or (64 if a.model == "encoder" else 224)
    torch.manual_seed(a.seed)
    model, x = make(a.model, a.batch, size)
    model.eval()
    meta = {"model": a.model, "batch": str(a.batch), "size": str(size), "seed": str(a.seed)}
    with torch.no_grad():
        y = model(x)
        if a.time > 0 and not a.tb_fx:
            times = []
            for _ in range(a.time + 1):
                t0 = time.perf_counter()
                model(x)
                times.append(time.perf_counter() - t0)
            times = sorted(times[1:])
            meta["torch_ms"] = "%.3f" % (1e3 * times[len(times) // 2])
            meta["torch_threads"] = str(torch.get_num_threads())
            print("torch_ms %s" % meta["torch_ms"])
    if a.tb_fx:  # instead of PyTorch's timing (its threads and memory would be ours' peers)
        tb_fx_time(model, x, y, a.tb_fx, max(a.time, 1))
        return
    if a.time_only:
        return
    tensors = {k: v for k, v in model.state_dict().items() if v.dtype == torch.float32}
    tensors["input"] = x
    tensors["output"] = y
    save(a.out, tensors, meta)


if __name__ == "__main__":
    main()
