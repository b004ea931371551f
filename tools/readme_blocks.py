#!/usr/bin/env python3
"""Extract the C code blocks of README.md so the tests can build every one of them.

    python3 tools/readme_blocks.py OUTDIR

Writes OUTDIR/readme_<N>.c for each ```c block (N counts from 1 in README order) and prints one
line per block: the file name, then "program" for a block with a main function (built, linked
and run) or "unit" for a block of top-level declarations (compiled after an include of the
header). Exit 2 when README.md has no C block or cannot be read.
"""
import os
import re
import sys


def blocks(text):
    found = []
    inside = False
    current = []
    for line in text.splitlines():
        if not inside and re.match(r"^```c\s*$", line):
            inside, current = True, []
        elif inside and line.startswith("```"):
            inside = False
            found.append("\n".join(current) + "\n")
        elif inside:
            current.append(line)
    return found


def main():
    if len(sys.argv) == 2 and sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    if len(sys.argv) != 2 or sys.argv[1].startswith("-"):
        print("usage: " + __doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        with open(os.path.join(root, "README.md"), encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        print(f"readme_blocks: cannot read README.md: {e}", file=sys.stderr)
        return 2
    found = blocks(text)
    if not found:
        print("readme_blocks: README.md has no ```c block", file=sys.stderr)
        return 2
    os.makedirs(sys.argv[1], exist_ok=True)
    for i, code in enumerate(found, 1):
        name = f"readme_{i}.c"
        program = re.search(r"\bint\s+main\s*\(", code) is not None
        if not program:
            code = '#include "torch_backend.h"\n' + code
        with open(os.path.join(sys.argv[1], name), "w", encoding="utf-8") as f:
            f.write(code)
        print(name, "program" if program else "unit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
