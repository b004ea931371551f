#!/usr/bin/env python3
"""Merge the parts under src/ into the single header torch_backend.h.

The parts are concatenated in the order of the manifest below, each one
preceded by a banner line.  Lines of the form  #include "..."  (the parts
including each other) are dropped; system includes  #include <...>  stay.
A .cl part (OpenCL C source) is embedded as a table of C string literals,
one literal per source line, so that no literal comes near the 4095
characters a C99 compiler has to accept.

The output depends only on the parts: no dates, no absolute paths.

    python3 amalgamate.py            write torch_backend.h
    python3 amalgamate.py --check    exit 1 if torch_backend.h is stale
    python3 amalgamate.py --list     print the manifest

Exit status: 0 success, 1 stale header (--check), 2 a part is missing or
unreadable or the manifest is invalid (nothing is written then).
"""

# The manifest: every part of the header, in order, relative to this
# script's folder.  Declarations first, then the implementation.
DECLARATION_PARTS = [
    "src/header_begin.h",
    "src/core/base.h",
    "src/core/shape.h",
    "src/core/device.h",
    "src/core/backend.h",
    "src/graph/ir.h",
    "src/graph/tensor.h",
    "src/graph/print.h",
    "src/runtime/opencl/opencl.h",
    "src/runtime/kit.h",
    "src/formats/interop.h",
    "src/formats/files.h",
    "src/train/autograd.h",
    "src/train/nn.h",
    "src/train/layers.h",
    "src/train/conv.h",
    "src/train/optim.h",
    "src/distributed/distributed.h",
    "src/distributed/shard.h",
    "src/header_end.h",
]
IMPLEMENTATION_PARTS = [
    "src/impl_begin.h",
    "src/core/base.c",
    "src/core/metrics.c",
    "src/core/rng.c",
    "src/core/shape.c",
    "src/core/device.c",
    "src/core/backend.c",
    "src/core/backend_data.c",
    "src/core/device_resolve.c",
    "src/graph/ops_table.h",
    "src/graph/ir.c",
    "src/graph/ir_graph.c",
    "src/graph/executor_internal.h",
    "src/graph/executor.c",
    "src/graph/executor_run.c",
    "src/graph/tensor.c",
    "src/graph/ops_internal.h",
    "src/graph/ops.c",
    "src/graph/ops_movement.c",
    "src/graph/ops_create.c",
    "src/graph/function.c",
    "src/graph/print.c",
    "src/reference/reference_internal.h",
    "src/reference/reference_elementwise.c",
    "src/reference/reference.c",
    "src/reference/cpu_backend.c",
    "src/train/autograd.c",
    "src/train/leaves.c",
    "src/train/saved.c",
    "src/train/nn.c",
    "src/train/layers.c",
    "src/train/conv.c",
    "src/train/optim.c",
    "src/compile/compile.h",
    "src/compile/diskcache.c",
    "src/compile/tuning.c",
    "src/compile/planner.c",
    "src/compile/planner_layout.c",
    "src/compile/index.c",
    "src/compile/prelude.cl",
    "src/compile/codegen.c",
    "src/compile/codegen_helpers.c",
    "src/compile/codegen_vector.c",
    "src/compile/codegen_pack.c",
    "src/compile/codegen_matmul.c",
    "src/compile/codegen_tiles.c",
    "src/compile/codegen_hoist.c",
    "src/compile/codegen_kernels.c",
    "src/compile/codegen_program.c",
    "src/compile/dialect_c99.c",
    "src/compile/dialect_opencl.c",
    "src/runtime/kit_internal.h",
    "src/runtime/kit.c",
    "src/runtime/opencl/opencl_internal.h",
    "src/runtime/opencl/opencl_api.c",
    "src/runtime/opencl/opencl_device.c",
    "src/runtime/opencl/opencl_program.c",
    "src/runtime/opencl/opencl.c",
    "src/runtime/native/native_internal.h",
    "src/runtime/native/native_pool.c",
    "src/runtime/native/native_runtime.c",
    "src/runtime/native/native_programs.c",
    "src/runtime/native/native.c",
    "src/distributed/distributed_internal.h",
    "src/distributed/mpi.c",
    "src/distributed/distributed.c",
    "src/distributed/shard.c",
    "src/formats/interop.c",
    "src/formats/files_internal.h",
    "src/formats/files.c",
    "src/formats/safetensors.c",
    "src/formats/inflate.c",
    "src/formats/npz.c",
    "src/formats/idx.c",
    "src/wiring.c",
    "src/impl_end.h",
]
PARTS = DECLARATION_PARTS + IMPLEMENTATION_PARTS

OUTPUT = "torch_backend.h"

import argparse
import os
import re
import sys
import tempfile

ROOT = os.path.dirname(os.path.abspath(__file__))

# One of our own includes on a line by itself, optionally followed by a comment.
OWN_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"[^"\n]*"[ \t]*(//.*|/\*.*\*/[ \t]*)?$')

# Bytes of source per string literal at most. A longer line is split over
# several chunks; the chunks joined in order give the source back.
MAX_CHUNK_BYTES = 1024


class PartError(Exception):
    """A part is missing or cannot be used; the message names it."""


def check_manifest(parts):
    seen = set()
    stems = {}
    for part in parts:
        if part in seen:
            raise PartError(f"manifest lists {part} twice")
        seen.add(part)
        if part.endswith(".cl"):
            stem = cl_stem(part)
            if stem in stems:
                raise PartError(f"{stems[stem]} and {part} both give the table name tb__cl_{stem}")
            stems[stem] = part


def cl_stem(part):
    name = os.path.basename(part)
    stem = name.rsplit(".", 1)[0]
    return re.sub(r"[^A-Za-z0-9_]", "_", stem)


def read_part(part):
    path = os.path.join(ROOT, part)
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        reason = e.strerror or str(e)
        raise PartError(f"cannot read part {part}: {reason}") from None


def c_part(part, data):
    """A C part: own includes dropped, LF line endings, no trailing blank lines."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PartError(f"part {part} is not valid UTF-8 (byte {e.start})") from None
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    lines = [line for line in text.split("\n") if not OWN_INCLUDE.match(line)]
    return "\n".join(lines).strip("\n")


def escape_bytes(chunk):
    """Bytes as the inside of a C string literal, ASCII only."""
    out = []
    prev = None
    for b in chunk:
        c = chr(b)
        if c == "\\":
            out.append("\\\\")
        elif c == '"':
            out.append('\\"')
        elif c == "\n":
            out.append("\\n")
        elif c == "\t":
            out.append("\\t")
        elif c == "\r":
            out.append("\\r")
        elif c == "?" and prev == "?":
            out.append("\\?")  # never form a trigraph such as ??=
        elif 0x20 <= b < 0x7F:
            out.append(c)
        else:
            out.append("\\%03o" % b)  # always three digits: a following digit stays a digit
        prev = c
    return "".join(out)


def cl_lines(data):
    lines = []
    start = 0
    while start < len(data):
        end = data.find(b"\n", start)
        if end < 0:
            lines.append(data[start:])
            break
        lines.append(data[start : end + 1])
        start = end + 1
    return lines


def build(parts):
    """The header's full text; PartError naming every part that cannot be used."""
    check_manifest(parts)
    contents = {}
    errors = []
    for part in parts:
        try:
            contents[part] = read_part(part)
        except PartError as e:
            errors.append(str(e))
    if errors:
        raise PartError("\n".join(errors))
    sections = []
    for part in parts:
        if part.endswith(".cl"):
            body = cl_table(part, contents[part])
        else:
            body = c_part(part, contents[part])
        banner = f"/* ---- {part} ---- */"
        sections.append(banner + "\n" + body if body else banner)
    return "\n\n".join(sections) + "\n"


def cl_table(part, data):
    if b"\0" in data:
        raise PartError(f"part {part} contains a NUL byte, which a C string cannot hold")
    literals = []
    for line in cl_lines(data):
        for i in range(0, len(line), MAX_CHUNK_BYTES):
            literals.append(line[i : i + MAX_CHUNK_BYTES])
    stem = cl_stem(part)
    # Kernel source only matters to the backends that compile programs (OpenCL, native): a build
    # without both must not see unused tables.
    out = [
        "#if !defined(TB_NO_OPENCL) || (!defined(TB_NO_NATIVE) && !defined(_WIN32))",
        "// clang-format off", f"static const char *const tb__cl_{stem}[] = {{"]
    out.extend(f'    "{escape_bytes(lit)}",' for lit in literals)
    out.append("    0")
    out.append("};")
    out.append(f"static const size_t tb__cl_{stem}_count = {len(literals)};")
    out.append("// clang-format on")
    out.append("#endif")
    return "\n".join(out)


def write_atomically(path, data):
    folder = os.path.dirname(os.path.abspath(path))
    prefix = "." + os.path.basename(path) + "."
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=prefix, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def show(line):
    if line is None:
        return "(end of file)"
    return line.replace("\r", "\\r")


def check(path, name, expected):
    try:
        with open(path, "rb") as f:
            actual = f.read()
    except FileNotFoundError:
        print(f"{name} is stale: it does not exist; run python3 amalgamate.py", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"{name} is stale: cannot read it: {e.strerror}", file=sys.stderr)
        return 1
    if actual == expected:
        print(f"{name} is up to date")
        return 0
    exp_lines = expected.decode("utf-8").split("\n")
    act_lines = actual.decode("utf-8", errors="replace").split("\n")
    n = 0
    while n < len(exp_lines) and n < len(act_lines) and exp_lines[n] == act_lines[n]:
        n += 1
    exp = exp_lines[n] if n < len(exp_lines) else None
    act = act_lines[n] if n < len(act_lines) else None
    print(f"{name} is stale: first difference at line {n + 1}", file=sys.stderr)
    print(f"  expected: {show(exp)}", file=sys.stderr)
    print(f"  actual:   {show(act)}", file=sys.stderr)
    print("run python3 amalgamate.py to regenerate it", file=sys.stderr)
    return 1


def main(argv):
    parser = argparse.ArgumentParser(
        description="Merge the parts under src/ into torch_backend.h.",
        epilog="Parts are found relative to this script's folder; --output is relative to the "
        "current folder. Exit status: 0 ok, 1 stale header (--check), 2 missing or "
        "unreadable part.",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--check", action="store_true", help="compare with the header on disk, write nothing"
    )
    mode.add_argument("--list", action="store_true", help="print the manifest, one part per line")
    parser.add_argument(
        "--output", metavar="PATH", help=f"where to write (default: {OUTPUT} beside this script)"
    )
    args = parser.parse_args(argv)

    if args.list:
        for part in PARTS:
            print(part)
        return 0

    path = args.output if args.output else os.path.join(ROOT, OUTPUT)
    try:
        text = build(PARTS)
    except PartError as e:
        for line in str(e).split("\n"):
            print(f"amalgamate.py: error: {line}", file=sys.stderr)
        print("amalgamate.py: nothing written", file=sys.stderr)
        return 2
    data = text.encode("utf-8")
    name = args.output if args.output else OUTPUT

    if args.check:
        return check(path, name, data)

    try:
        with open(path, "rb") as f:
            if f.read() == data:
                print(f"{name} is up to date ({text.count(chr(10))} lines)")
                return 0
    except OSError:
        pass
    try:
        write_atomically(path, data)
    except OSError as e:
        print(f"amalgamate.py: error: cannot write {name}: {e.strerror or e}", file=sys.stderr)
        return 2
    print(f"wrote {name} ({text.count(chr(10))} lines, {len(PARTS)} parts)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
