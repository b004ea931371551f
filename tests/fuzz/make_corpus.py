#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz harnesses under tests/fuzz/corpus/<target>/.

    python3 tests/fuzz/make_corpus.py [TARGET...]

TARGET is npy, parse, dlpack, graph, safetensors, npz or idx (default: all). The .npy seeds are
written by numpy itself (only the npy target needs it); parse, dlpack and graph decode any
bytes, so their seeds are short texts (parse) or bytes laid out as the harness reads them
(dlpack, graph), plus a few from a fixed random seed. The model files (safetensors, npz, idx)
are written here with the standard library (struct, zlib, zipfile): small valid files of every
dtype, rank 0 to 3 and empty tensors, deflated and stored zip entries, plain and gzip IDX, and a
few that must be refused. The output is the same on every run with the same numpy and zlib.
"""
import gzip
import io
import json
import os
import random
import struct
import sys
import zipfile
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")


def write(target, name, data):
    folder = os.path.join(CORPUS, target)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data)


def npy_seeds():
    import numpy as np

    def save(name, array, version=None):
        buf = io.BytesIO()
        if version is None:
            np.save(buf, array, allow_pickle=False)
        else:
            np.lib.format.write_array(buf, array, version=version, allow_pickle=False)
        write("npy", name, buf.getvalue())

    save("f4_2x3.npy", np.arange(6, dtype="<f4").reshape(2, 3))
    save("f8_scalar.npy", np.array(2.5, dtype="<f8"))
    save("i4_big_endian.npy", np.array([1, -2, 258], dtype=">i4"))
    save("i8_empty.npy", np.zeros((0, 3), dtype="<i8"))
    save("u1_2x2x2.npy", np.arange(8, dtype="u1").reshape(2, 2, 2))
    save("b1.npy", np.array([True, False, True]))
    save("f4_v2.npy", np.ones((2,), dtype="<f4"), version=(2, 0))
    save("f4_fortran.npy", np.asfortranarray(np.ones((2, 3), dtype="<f4")))
    # a header that claims 128 GiB in a file of a few dozen bytes
    header = b"{'descr': '<f4', 'fortran_order': False, 'shape': (32, 1024, 1024, 1024), }"
    header = header + b" " * ((64 - (10 + len(header) + 1) % 64) % 64) + b"\n"
    write("npy", "claims_128gib.npy",
          b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + bytes(10))


def parse_seeds():
    texts = [
        "f32[2,3]",
        "i64[]",
        "u8[ 0 , 9223372036854775807 ]",
        "bool[1,2,3,4,5,6,7,8]",
        "f64[3,9223372036854775807,0]",
        "cpu:0",
        "cpu",
        "float32",
        "accelerator",
        "layer_norm",
    ]
    for i, text in enumerate(texts):
        write("parse", "text_%02d" % i, text.encode())


def dlpack_seeds():
    # The bytes in the order fuzz_dlpack.c reads them: flags (bit 0 versioned, bit 1 strided),
    # ndim + 1, dtype code index (float int uint bool bfloat), bits index (8 16 32 64 1),
    # lanes (not 0: one lane), then per dim a size byte (0..6) and a stride byte (value + 3),
    # the start of the data in the buffer (a tag byte, then low and high), the byte_offset (a
    # tag byte, then the offset), the major version (not 0: the right one).
    def seed(name, flags, code, bits, dims, strides, start=64, byte_offset=0):
        out = bytes([flags, len(dims) + 1, code, bits, 1])
        for size, stride in zip(dims, strides):
            out += bytes([size, stride + 3])
        out += bytes([1, start % 8, start // 8, 1, byte_offset, 1])
        write("dlpack", name, out)

    seed("f32_2x2_contiguous", 0, 0, 2, [2, 2], [2, 1])
    seed("f32_2x3_strided", 2, 0, 2, [2, 3], [4, 1])
    seed("i64_3_versioned", 3, 1, 3, [3], [1])
    seed("u8_reversed", 2, 2, 0, [4], [-1], start=200)
    seed("bool_2x2_offset", 2, 3, 0, [2, 2], [1, 2], byte_offset=3)
    seed("f64_transposed", 2, 0, 3, [3, 2], [1, 3])


def graph_seeds():
    rng = random.Random(20240601)
    for i in range(8):
        write("graph", "random_%02d" % i, bytes(rng.randrange(256) for _ in range(48)))
    # Laid out as fuzz_graph.c reads them: two leaves from host arrays (f32[2,3] of ones,
    # f32[3,2] of twos), then four steps: matmul, a sum over axis 1, softmax through
    # tb_call_op, a slice with step 2.
    ones = [1, 136, 0, 0] * 6
    twos = [1, 144, 0, 0] * 6
    program = [1]                            # two leaves
    program += [0, 0, 2, 2, 3, 0] + ones     # from host: f32, rank 2, dims 2 3
    program += [0, 0, 2, 3, 2, 0] + twos     # from host: f32, rank 2, dims 3 2
    program += [4]                           # four steps
    program += [1, 0, 2, 15, 1]              # api: binary #15 (matmul) of pool 0 and 1
    program += [1, 2, 7, 0, 1, 6, 0]         # api: reduction of pool 2, axes [1], sum
    program += [0, 45, 2, 1, 2]              # tb_call_op(softmax) of pool 2, attrs [1]
    program += [1, 3, 16, 5, 3, 15, 5]       # api: slice of pool 3, dim 0, [0:12:2]
    write("graph", "matmul_chain", bytes(program))


def safetensors_file(tensors, metadata=None, align=8, raw_header=None):
    """A safetensors file of (name, dtype, shape, data bytes) in that order; the header padded
    with spaces to `align` bytes (1: not padded)."""
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    offset = 0
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = raw_header if raw_header is not None else json.dumps(header).encode()
    text += b" " * ((align - (8 + len(text)) % align) % align)
    return struct.pack("<Q", len(text)) + text + b"".join(t[3] for t in tensors)


def safetensors_seeds():
    def pack(fmt, values):
        return struct.pack("<%d%s" % (len(values), fmt), *values)

    write("safetensors", "f32_2x3.safetensors",
          safetensors_file([("weight", "F32", (2, 3), pack("f", [0, 1, 2, 3, 4.5, -6]))]))
    write("safetensors", "f64_scalar.safetensors",
          safetensors_file([("scale", "F64", (), pack("d", [2.5]))]))
    write("safetensors", "i64_empty.safetensors",
          safetensors_file([("none", "I64", (0, 3), b"")]))
    write("safetensors", "u8_2x2x2.safetensors",
          safetensors_file([("bytes", "U8", (2, 2, 2), bytes([0, 1, 2, 127, 128, 200, 254, 9]))]))
    write("safetensors", "bool_3.safetensors",
          safetensors_file([("mask", "BOOL", (3,), bytes([1, 0, 2]))]))
    write("safetensors", "f16_bf16.safetensors",
          safetensors_file([("half", "F16", (4,), pack("H", [0x3C00, 0x8001, 0x7C00, 0x7E00])),
                            ("brain", "BF16", (2, 2),
                             pack("H", [0x3F80, 0xC000, 0x0001, 0xFF80]))]))
    write("safetensors", "mixed_metadata.safetensors",
          safetensors_file([("layer.0.w", "F64", (2,), pack("d", [1e300, -0.0])),
                            ("layer.0.b", "I32", (3,), pack("i", [-1, 2 ** 31 - 1, -2 ** 31])),
                            ("steps", "I64", (1,), pack("q", [-(2 ** 63)])),
                            ("flag", "BOOL", (), b"\x01")],
                           metadata={"format": "pt", "note": "caf\u00e9 \ud83d\ude00"}))
    write("safetensors", "unaligned.safetensors",
          safetensors_file([("a", "U8", (3,), b"abc"), ("b", "F32", (2,), pack("f", [1, 2]))],
                           align=1))
    write("safetensors", "null_metadata.safetensors",
          safetensors_file([], raw_header=b'{"__metadata__":null}'))
    write("safetensors", "escaped_name_tensor.safetensors",
          safetensors_file([("x", "I32", (1, 1), pack("i", [7]))],
                           raw_header=b'{"\\u00e9\\n\\"q\\/":{"dtype":"I32","shape":[1,1],'
                                      b'"data_offsets":[0,4]}}'))
    write("safetensors", "only_metadata.safetensors",
          safetensors_file([], metadata={"k": "v"}))
    # refused: a dtype the library does not have, offsets with a gap, a shape of 2^62 elements
    write("safetensors", "i16_refused.safetensors",
          safetensors_file([("s", "I16", (2,), pack("h", [1, -1]))]))
    write("safetensors", "gap_refused.safetensors",
          safetensors_file([], raw_header=b'{"a":{"dtype":"U8","shape":[1],'
                                          b'"data_offsets":[1,2]}}') + b"xy")
    write("safetensors", "huge_shape_refused.safetensors",
          safetensors_file([], raw_header=b'{"a":{"dtype":"F32","shape":[4611686018427387904,'
                                          b'4],"data_offsets":[0,0]}}'))


def npy_bytes(descr, shape, data, fortran=False, version=1):
    """A .npy file as numpy writes it: the header padded with spaces to 64 bytes."""
    dims = "".join("%d," % d for d in shape) if len(shape) == 1 else ",".join(
        "%d" % d for d in shape)
    header = "{'descr': '%s', 'fortran_order': %s, 'shape': (%s), }" % (
        descr, "True" if fortran else "False", dims)
    preamble = 10 if version == 1 else 12
    header = header.encode("latin1")
    header += b" " * ((64 - (preamble + len(header) + 1) % 64) % 64) + b"\n"
    length = struct.pack("<H", len(header)) if version == 1 else struct.pack("<I", len(header))
    return b"\x93NUMPY" + bytes([version, 0]) + length + header + data


def zip_bytes(entries, zip64=False):
    """A zip of (name, bytes, method) entries, method zipfile.ZIP_STORED or ZIP_DEFLATED; with
    zip64, every central directory record keeps its sizes and offset in a zip64 extra field and
    the zip64 end records are written."""
    if not zip64:
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as z:
            for name, data, method in entries:
                info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
                info.compress_type = method
                info.external_attr = 0o600 << 16
                z.writestr(info, data)
        return buf.getvalue()
    out = b""
    central = b""
    for name, data, method in entries:
        packed = deflate(data) if method == zipfile.ZIP_DEFLATED else data
        crc = zlib.crc32(data)
        offset = len(out)
        code = 8 if method == zipfile.ZIP_DEFLATED else 0
        local_extra = struct.pack("<HHQQ", 1, 16, len(data), len(packed))
        out += struct.pack("<IHHHHHIIIHH", 0x04034b50, 45, 0, code, 0, 33, crc, 0xffffffff,
                           0xffffffff, len(name), len(local_extra)) + name.encode() + local_extra
        out += packed
        extra = struct.pack("<HHQQQ", 1, 24, len(data), len(packed), offset)
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014b50, 45, 45, 0, code, 0, 33, crc,
                               0xffffffff, 0xffffffff, len(name), len(extra), 0, 0, 0, 0,
                               0xffffffff) + name.encode() + extra
    cd_offset = len(out)
    out += central
    zip64_end = len(out)
    out += struct.pack("<IQHHIIQQQQ", 0x06064b50, 44, 45, 45, 0, 0, len(entries), len(entries),
                       len(central), cd_offset)
    out += struct.pack("<IIQI", 0x07064b50, 0, zip64_end, 1)
    out += struct.pack("<IHHHHIIH", 0x06054b50, 0, 0, 0xffff, 0xffff, 0xffffffff, 0xffffffff, 0)
    return out


def deflate(data, level=6, strategy=zlib.Z_DEFAULT_STRATEGY):
    c = zlib.compressobj(level, zlib.DEFLATED, -15, 8, strategy)
    return c.compress(data) + c.flush()


def npz_seeds():
    stored, deflated = zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED
    f4 = npy_bytes("<f4", (2, 3), struct.pack("<6f", 0, 1, 2, 3, 4, 5))
    f8 = npy_bytes("<f8", (), struct.pack("<d", -2.5))
    i8 = npy_bytes("<i8", (0, 3), b"")
    u1 = npy_bytes("|u1", (2, 2, 2), bytes(range(8)))
    b1 = npy_bytes("|b1", (3,), bytes([1, 0, 1]))
    f2 = npy_bytes("<f2", (2,), struct.pack("<2H", 0x3c00, 0xfc00))
    i4_big = npy_bytes(">i4", (3,), struct.pack(">3i", 1, -2, 258))
    i4_v2 = npy_bytes("<i4", (1, 2), struct.pack("<2i", 7, -7), version=2)
    write("npz", "stored_f4.npz", zip_bytes([("w.npy", f4, stored)]))
    write("npz", "deflated_f4.npz", zip_bytes([("w.npy", f4, deflated)]))
    write("npz", "mixed.npz", zip_bytes([("scale.npy", f8, stored), ("empty.npy", i8, deflated),
                                         ("cube.npy", u1, stored), ("mask.npy", b1, deflated),
                                         ("half.npy", f2, stored)]))
    write("npz", "big_endian_v2.npz", zip_bytes([("big.npy", i4_big, deflated),
                                                 ("v2.npy", i4_v2, stored)]))
    write("npz", "folder_name.npz", zip_bytes([("layer/w.npy", u1, stored)]))
    write("npz", "zip64.npz", zip_bytes([("a.npy", f8, stored), ("b.npy", u1, deflated)],
                                        zip64=True))
    write("npz", "empty.npz", zip_bytes([]))
    # the three kinds of deflate block: stored, fixed and dynamic Huffman codes, and several
    # blocks in one entry
    ramp = npy_bytes("<i4", (64,), struct.pack("<64i", *[i * i % 1000 for i in range(64)]))
    for name, packed in [("level0", deflate(ramp, level=0)),
                         ("fixed", deflate(ramp, strategy=zlib.Z_FIXED)),
                         ("dynamic", deflate(ramp, level=9))]:
        write("npz", "deflate_%s.npz" % name, rezip_deflated("ramp.npy", ramp, packed))
    c = zlib.compressobj(6, zlib.DEFLATED, -15)
    blocks = c.compress(ramp[:100]) + c.flush(zlib.Z_FULL_FLUSH) + c.compress(ramp[100:]) + \
        c.flush()
    write("npz", "deflate_blocks.npz", rezip_deflated("ramp.npy", ramp, blocks))
    # refused: a CRC-32 that does not match, Fortran order, an entry not named .npy
    bad = bytearray(zip_bytes([("w.npy", f4, stored)]))
    bad[bad.rfind(b"PK\x01\x02") + 16] ^= 1
    write("npz", "crc_refused.npz", bytes(bad))
    write("npz", "fortran_refused.npz", zip_bytes(
        [("f.npy", npy_bytes("<f4", (2, 2), bytes(16), fortran=True), deflated)]))
    write("npz", "not_npy_refused.npz", zip_bytes([("readme.txt", b"hello", stored)]))


def rezip_deflated(name, data, packed):
    """A zip of one deflated entry whose data are the given deflate stream."""
    crc = zlib.crc32(data)
    local = struct.pack("<IHHHHHIIIHH", 0x04034b50, 20, 0, 8, 0, 33, crc, len(packed), len(data),
                        len(name), 0) + name.encode()
    central = struct.pack("<IHHHHHHIIIHHHHHII", 0x02014b50, 20, 20, 0, 8, 0, 33, crc, len(packed),
                          len(data), len(name), 0, 0, 0, 0, 0, 0) + name.encode()
    body = local + packed
    return body + central + struct.pack("<IHHHHIIH", 0x06054b50, 0, 0, 1, 1, len(central),
                                        len(body), 0)


def idx_bytes(code, dims, values):
    fmt = {0x08: "B", 0x09: "b", 0x0B: "h", 0x0C: "i", 0x0D: "f", 0x0E: "d"}[code]
    return (bytes([0, 0, code, len(dims)]) + struct.pack(">%dI" % len(dims), *dims) +
            struct.pack(">%d%s" % (len(values), fmt), *values))


def gzip_bytes(data, name=None, extra=None, comment=None, header_crc=False):
    """One gzip member (mtime 0) with the optional header fields set."""
    flags = (4 if extra is not None else 0) | (8 if name is not None else 0) | \
        (16 if comment is not None else 0) | (2 if header_crc else 0)
    header = bytes([0x1F, 0x8B, 8, flags, 0, 0, 0, 0, 0, 255])
    if extra is not None:
        header += struct.pack("<H", len(extra)) + extra
    if name is not None:
        header += name + b"\0"
    if comment is not None:
        header += comment + b"\0"
    if header_crc:
        header += struct.pack("<H", zlib.crc32(header) & 0xFFFF)
    return header + deflate(data, level=9) + struct.pack("<II", zlib.crc32(data),
                                                         len(data) & 0xFFFFFFFF)


def idx_seeds():
    images = idx_bytes(0x08, (3, 2, 2), list(range(0, 240, 20)))
    labels = idx_bytes(0x08, (5,), [7, 2, 1, 0, 4])
    write("idx", "u8_images.idx", images)
    write("idx", "u8_labels.idx", labels)
    write("idx", "i8.idx", idx_bytes(0x09, (4,), [-128, -1, 0, 127]))
    write("idx", "i16_2x2.idx", idx_bytes(0x0B, (2, 2), [-32768, -1, 1, 32767]))
    write("idx", "i32.idx", idx_bytes(0x0C, (3,), [-(2 ** 31), 0, 2 ** 31 - 1]))
    write("idx", "f32_1x3.idx", idx_bytes(0x0D, (1, 3), [0.5, -1e30, float("inf")]))
    write("idx", "f64.idx", idx_bytes(0x0E, (2,), [3.25, float("nan")]))
    write("idx", "u8_empty.idx", idx_bytes(0x08, (0, 5), []))
    write("idx", "u8_images.idx.gz", gzip.compress(images, compresslevel=9, mtime=0))
    write("idx", "i16_named.idx.gz",
          gzip_bytes(idx_bytes(0x0B, (3,), [1, -300, 300]), name=b"i16.idx"))
    write("idx", "f32_all_fields.idx.gz",
          gzip_bytes(idx_bytes(0x0D, (2, 1), [1.0, -2.0]), name=b"f.idx", extra=b"ab\x02\x00xy",
                     comment=b"fuzz seed", header_crc=True))
    write("idx", "f64_empty.idx.gz", gzip_bytes(idx_bytes(0x0E, (3, 0, 2), [])))
    # refused: rank 0, trailing data, a second gzip member
    write("idx", "rank0_refused.idx", bytes([0, 0, 8, 0]))
    write("idx", "trailing_refused.idx", labels + b"\x00")
    write("idx", "two_members_refused.idx.gz",
          gzip.compress(labels, mtime=0) + gzip.compress(labels, mtime=0))


TARGETS = {
    "npy": npy_seeds,
    "parse": parse_seeds,
    "dlpack": dlpack_seeds,
    "graph": graph_seeds,
    "safetensors": safetensors_seeds,
    "npz": npz_seeds,
    "idx": idx_seeds,
}


def main(argv):
    targets = argv or list(TARGETS)
    for target in targets:
        if target not in TARGETS:
            sys.stderr.write("make_corpus.py: unknown target %s (targets: %s)\n" %
                             (target, " ".join(TARGETS)))
            return 2
    for target in targets:
        TARGETS[target]()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
