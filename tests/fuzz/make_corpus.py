#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz harnesses under tests/fuzz/corpus/<target>/.

    /usr/bin/python3 tests/fuzz/make_corpus.py

The .npy seeds are written by numpy itself; the other targets decode any bytes, so their seeds
are short texts (parse) or bytes laid out as the harness reads them (dlpack, graph), plus a few
from a fixed random seed. The output is the same on every run with the same numpy.
"""
import io
import os
import random
import struct
import sys

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


def main():
    npy_seeds()
    parse_seeds()
    dlpack_seeds()
    graph_seeds()
    return 0


if __name__ == "__main__":
    sys.exit(main())
