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
    "src/base.h",
    "src/shape.h",
    "src/device.h",
    "src/backend.h",
    "src/ir.h",
    "src/tensor.h",
    "src/print.h",
    "src/opencl.h",
    "src/interop.h",
    "src/files.h",
    "src/autograd.h",
    "src/nn.h",
    "src/layers.h",
    "src/conv.h",
    "src/optim.h",
    "src/distributed.h",
    "src/shard.h",
    "src/header_end.h",
]
IMPLEMENTATION_PARTS = [
    "src/impl_begin.h",
    "src/base.c",
    "src/metrics.c",
    "src/rng.c",
    "src/shape.c",
    "src/device.c",
    "src/backend.c",
    "src/backend_data.c",
    "src/device_resolve.c",
    "src/ir.c",
    "src/ir_graph.c",
    "src/executor_internal.h",
    "src/executor.c",
    "src/executor_run.c",
    "src/tensor.c",
    "src/ops_internal.h",
    "src/ops.c",
    "src/ops_movement.c",
    "src/ops_create.c",
    "src/reference_internal.h",
    "src/reference_elementwise.c",
    "src/reference.c",
    "src/cpu_backend.c",
    "src/print.c",
    "src/autograd.c",
    "src/nn.c",
    "src/layers.c",
    "src/conv.c",
    "src/optim.c",
    "src/compile.h",
    "src/diskcache.c",
    "src/tuning.c",
    "src/planner.c",
    "src/planner_layout.c",
    "src/index.c",
    "src/prelude.cl",
    "src/codegen.c",
    "src/codegen_matmul.c",
    "src/codegen_kernels.c",
    "src/opencl_internal.h",
    "src/opencl_api.c",
    "src/opencl_device.c",
    "src/opencl_program.c",
    "src/opencl.c",
    "src/native_dialect.c",
    "src/native_internal.h",
    "src/native_pool.c",
    "src/native_runtime.c",
    "src/native_programs.c",
    "src/native.c",
    "src/distributed_internal.h",
    "src/mpi.c",
    "src/distributed.c",
    "src/shard.c",
    "src/interop.c",
    "src/files_internal.h",
    "src/files.c",
    "src/safetensors.c",
    "src/inflate.c",
    "src/npz.c",
    "src/idx.c",
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
