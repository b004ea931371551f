"""safetensors and .npz between torch_backend.h and numpy or PyTorch (tests/test_safetensors.c
and tests/test_npz.c run it). safetensors is written and read here with the standard library and
numpy only (struct + json), following the format's specification, or with PyTorch's own bytes
of each tensor (the `safetensors` package is not in Debian); .npz through numpy itself.

Usage: python3 tests/model_files_numpy.py COMMAND DIR
  write-safetensors DIR   DIR/py.safetensors, and DIR/py_<name>.npy with each tensor's value
                          (float16 and bfloat16 values as float32: the library's f16 and bf16
                          tensors cast to f32)
  check-safetensors DIR   reads DIR/c.safetensors strictly; compares each tensor with
                          DIR/c_<name>.npy (F16 and BF16 widened to float32) and the metadata
                          with DIR/c_metadata.json
  write-safetensors-torch DIR
                          DIR/torch.safetensors from PyTorch tensors (bfloat16 and float16
                          among them, their bytes as torch keeps them), DIR/torch_orig.pt with
                          the tensors, DIR/torch_<name>.npy with their values (half types
                          widened by torch's .float()), DIR/torch_names.txt
  check-safetensors-torch DIR
                          reads DIR/c_torch.safetensors into PyTorch tensors (torch.frombuffer)
                          and compares each with the tensor of DIR/torch_orig.pt it came from
  write-npz DIR           DIR/py.npz (numpy.savez), DIR/py_compressed.npz (savez_compressed),
                          and DIR/py_<name>.npy for each array
  check-npz DIR           numpy.load of DIR/c.npz and DIR/c_zip64.npz; each array compared
                          with DIR/c_<name>.npy
Exit status: 0 passed, 77 numpy (or, for the torch commands, PyTorch) is not installed
(skip), 1 a check failed.
"""
import json
import struct
import sys

try:
    import numpy as np
except ImportError:
    print("numpy is not installed")
    sys.exit(77)

ST_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8", "I32": "<i4",
             "U8": "|u1", "BOOL": "|b1"}


def arrays():
    """The arrays each writer stores: every dtype, rank 0, empty, odd shapes, large ones."""
    rng = np.random.default_rng(7)
    return {
        "f32.weight": rng.standard_normal((3, 5)).astype(np.float32),
        "f64": np.linspace(-2, 2, 7),
        "i32": np.arange(-6, 6, dtype=np.int32).reshape(2, 3, 2),
        "i64": np.array([np.iinfo(np.int64).min, -1, 0, np.iinfo(np.int64).max]),
        "u8": np.arange(0, 250, 7, dtype=np.uint8),
        "bool": np.array([[True, False, True], [False, False, True]]),
        "scalar": np.array(3.5, dtype=np.float32),
        "empty": np.zeros((2, 0, 3), dtype=np.float32),
        "big": rng.standard_normal(70000).astype(np.float32),
        "ramp": np.arange(100000, dtype=np.int64) % 1000,
        "zeros": np.zeros((64, 64), dtype=np.float64),
        "unicode.é": np.ones(3, dtype=np.int32),
    }


def write_safetensors(d):
    data = arrays()
    del data["unicode.é"]  # named below with a JSON escape
    data["name \"quoted\" é"] = np.ones(2, dtype=np.uint8)
    half = np.array([1.0, -2.0, 2.0 ** -24, np.inf, -0.0, 65504.0], dtype=np.float16)
    bf16_bits = np.array([0x3F80, 0x4049, 0xC2F7, 0x7F80, 0x0001], dtype=np.uint16)
    header, blobs, offset = {"__metadata__": {"format": "pt", "note": "ünïcode \"q\""}}, [], 0

    def add(name, dtype, shape, raw):
        nonlocal offset
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)

    # the reference writer's order: larger dtypes first keeps every tensor aligned
    for name, a in sorted(data.items(), key=lambda kv: -kv[1].dtype.itemsize):
        code = {np.dtype("<f8"): "F64", np.dtype("<f4"): "F32", np.dtype("<i8"): "I64",
                np.dtype("<i4"): "I32", np.dtype("u1"): "U8", np.dtype("bool"): "BOOL"}[a.dtype]
        add(name, code, a.shape, np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<")).tobytes())
        np.save("%s/py_%s.npy" % (d, name), a)
    add("half", "F16", half.shape, half.astype("<f2").tobytes())
    np.save("%s/py_half.npy" % d, half.astype(np.float32))
    add("bf16", "BF16", bf16_bits.shape, bf16_bits.astype("<u2").tobytes())
    widened = (bf16_bits.astype(np.uint32) << 16).view(np.float32)
    np.save("%s/py_bf16.npy" % d, widened)
    text = json.dumps(header, ensure_ascii=True).encode()
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    with open("%s/py.safetensors" % d, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    with open("%s/py_names.txt" % d, "w", encoding="utf-8") as f:
        f.write("\n".join(k for k in header if k != "__metadata__") + "\n")
    return 0


def check_safetensors(d):
    failures = []
    with open("%s/c.safetensors" % d, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    data = raw[8 + n:]
    meta = header.pop("__metadata__", {})
    with open("%s/c_metadata.json" % d, encoding="utf-8") as f:
        if meta != json.load(f):
            failures.append("metadata %r" % meta)
    spans = sorted(tuple(v["data_offsets"]) for v in header.values())
    pos = 0
    for b, e in spans:
        if b != pos:
            failures.append("data not contiguous at %d" % b)
        pos = e
    if pos != len(data):
        failures.append("data length %d, tensors end at %d" % (len(data), pos))
    if (8 + n) % 8:
        failures.append("header length %d leaves the data unaligned" % n)
    for name, info in header.items():
        b, e = info["data_offsets"]
        dtype = np.dtype(ST_DTYPES[info["dtype"]])
        if b % dtype.itemsize:
            failures.append("%s starts at %d, not aligned" % (name, b))
        a = np.frombuffer(data[b:e], dtype=dtype).reshape(info["shape"])
        if info["dtype"] == "BF16":  # numpy has no bfloat16: its bits widened to float32
            a = (a.astype(np.uint32) << 16).view(np.float32)
        elif info["dtype"] == "F16":
            a = a.astype(np.float32)
        want = np.load("%s/c_%s.npy" % (d, name))
        if a.dtype != want.dtype or a.shape != want.shape or not np.array_equal(a, want):
            failures.append("%s: %r != %r" % (name, a, want))
        else:
            print("ok   %s %s %s" % (name, info["dtype"], info["shape"]))
    for f in failures:
        print("FAIL " + f)
    return 1 if failures else 0


def torch_or_skip():
    try:
        import torch
    except ImportError:
        print("PyTorch is not installed")
        sys.exit(77)
    return torch


def torch_codes(torch):
    """safetensors dtype names of the PyTorch dtypes."""
    return {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16",
            torch.bfloat16: "BF16", torch.int64: "I64", torch.int32: "I32", torch.uint8: "U8",
            torch.bool: "BOOL"}


def torch_tensors(torch):
    g = torch.Generator().manual_seed(11)
    return {
        "model.embed.weight": torch.randn(6, 5, generator=g).to(torch.bfloat16),
        "model.norm.bias": (torch.randn(7, generator=g) * 1000).to(torch.float16),
        "bf16.specials": torch.tensor([0.0, -0.0, float("inf"), float("-inf"), 1e-40, 3e38],
                                      dtype=torch.bfloat16),
        "f16.specials": torch.tensor([65504.0, -65504.0, 6e-8, float("inf"), -0.0],
                                     dtype=torch.float16),
        "layer.0.weight": torch.randn(4, 3, 2, generator=g),
        "layer.0.scale": torch.randn(3, generator=g, dtype=torch.float64),
        "position_ids": torch.arange(-5, 11, dtype=torch.int64).reshape(2, 8),
        "counts": torch.randint(-1000, 1000, (9,), generator=g, dtype=torch.int32),
        "pixels": torch.randint(0, 256, (2, 3, 4), generator=g, dtype=torch.uint8),
        "mask": torch.randn(3, 3, generator=g) > 0,
        "step": torch.tensor(12345, dtype=torch.int64),
        "empty": torch.zeros(0, 4),
    }


def write_safetensors_torch(d):
    torch = torch_or_skip()
    codes = torch_codes(torch)
    tensors = torch_tensors(torch)
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in tensors.items():
        t = t.contiguous()
        # the bytes as PyTorch keeps them (little-endian on every machine PyTorch runs on)
        same_size = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
        raw = t.view(same_size[t.element_size()]).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": codes[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
        widened = t.float() if t.dtype in (torch.float16, torch.bfloat16) else t
        np.save("%s/torch_%s.npy" % (d, name), widened.numpy())
    text = json.dumps(header).encode()
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    with open("%s/torch.safetensors" % d, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    torch.save(tensors, "%s/torch_orig.pt" % d)
    with open("%s/torch_names.txt" % d, "w", encoding="utf-8") as f:
        f.write("\n".join(tensors) + "\n")
    return 0


def check_safetensors_torch(d):
    torch = torch_or_skip()
    names = {v: k for k, v in torch_codes(torch).items()}
    orig = torch.load("%s/torch_orig.pt" % d)
    with open("%s/c_torch.safetensors" % d, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    header.pop("__metadata__", None)
    data = bytearray(raw[8 + n:])
    failures = []
    if sorted(header) != sorted(orig):
        failures.append("names %r, expected %r" % (sorted(header), sorted(orig)))
    for name, info in header.items():
        b, e = info["data_offsets"]
        dtype = names[info["dtype"]]
        if e > b:
            count = (e - b) // torch.empty(0, dtype=dtype).element_size()
            t = torch.frombuffer(data, dtype=dtype, count=count, offset=b)
            t = t.reshape(info["shape"])
        else:
            t = torch.empty(info["shape"], dtype=dtype)
        want = orig.get(name)
        if want is None:
            continue
        # float16 and bfloat16 come back as they went, bit for bit
        if t.dtype != want.dtype or t.shape != want.shape or not torch.equal(t, want):
            failures.append("%s: %r != %r" % (name, t, want))
        else:
            print("ok   torch %s %s %s" % (name, t.dtype, list(t.shape)))
    for f in failures:
        print("FAIL " + f)
    return 1 if failures else 0


def write_npz(d):
    data = arrays()
    data["big_endian"] = np.arange(5, dtype=">f8")
    data["fortranless"] = np.arange(12, dtype=np.float32).reshape(3, 4).T.copy()
    np.savez("%s/py.npz" % d, **data)
    np.savez_compressed("%s/py_compressed.npz" % d, **data)
    for name, a in data.items():
        np.save("%s/py_%s.npy" % (d, name), a)
    with open("%s/py_names.txt" % d, "w", encoding="utf-8") as f:
        f.write("\n".join(data) + "\n")
    return 0


def check_npz(d):
    failures = []
    for archive in ("c.npz", "c_zip64.npz"):
        with np.load("%s/%s" % (d, archive)) as z:
            for name in z.files:
                a, want = z[name], np.load("%s/c_%s.npy" % (d, name))
                if a.dtype != want.dtype or a.shape != want.shape or not np.array_equal(a, want):
                    failures.append("%s %s: %r != %r" % (archive, name, a, want))
                else:
                    print("ok   %s %s %s %s" % (archive, name, a.dtype, a.shape))
            if not z.files:
                failures.append("%s is empty" % archive)
    for f in failures:
        print("FAIL " + f)
    return 1 if failures else 0


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    command, d = sys.argv[1], sys.argv[2]
    return {"write-safetensors": write_safetensors, "check-safetensors": check_safetensors,
            "write-safetensors-torch": write_safetensors_torch,
            "check-safetensors-torch": check_safetensors_torch,
            "write-npz": write_npz, "check-npz": check_npz}[command](d)


if __name__ == "__main__":
    sys.exit(main())
