#!/usr/bin/env python3
"""Check the layering of src/: the parts of the implementation, in the order of amalgamate.py's
manifest, are layers, and each may use only itself and the layers before it.

    python3 tools/check_layers.py          report, exit 1 on a violation

Checks:
  1. No part calls a function (tb_* or tb__*) that a later part defines. The one exception is
     the wiring part (the last C part before impl_end.h closes the implementation: it names the
     hooks of every layer so that earlier layers can call them through a table without naming
     them); calls to the wiring's accessor are allowed from anywhere.
  2. An internal function (tb__*) that a part uses but another part defines is declared in an
     internal contract part (a .h part of the implementation: impl_begin.h and the contract
     headers listed in the manifest), so that what layers use of each other is written down.
  3. No part is longer than MAX_PART_LINES lines, and no function longer than MAX_FUNCTION_LINES
     (the budget of a part and of a function a reader can hold in mind).
  4. The folders of src/ are layers: the parts of each folder come as one run in the manifest
     (the top folder's own parts, which open and close the implementation, excepted), and
     every part of src/ and its folders is in the manifest.

Comments and string literals are ignored. Function definitions are found at the start of a
line in the clang-format layout the sources keep.
"""

import importlib.util
import os
import re
import sys

MAX_PART_LINES = 1500
MAX_FUNCTION_LINES = 120

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def manifest():
    spec = importlib.util.spec_from_file_location("amalgamate", os.path.join(ROOT, "amalgamate.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.IMPLEMENTATION_PARTS


def strip(text):
    """The text without comments and string or character literals (line numbers kept)."""
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r'"(\\.|[^"\\\n])*"', '""', text)
    text = re.sub(r"'(\\.|[^'\\\n])'", "''", text)
    return text


DEF = re.compile(r"^(?:TB__UNUSED\s+)?(?:static|TBDEF)\b[^;{]*?\b(tb_\w+)\s*\([^;]*?\)\s*\{",
                 re.M | re.S)
DECL = re.compile(r"^(?:TB__UNUSED\s+)?static\b[^;{}]*?\b(tb__\w+)\s*\([^{]*?\)\s*"
                  r"(?:TB_PRINTF_LIKE\([^)]*\)\s*)?;", re.M | re.S)
CALL = re.compile(r"\b(tb_\w+)\s*\(")


def functions(text):
    """(name, first line, number of lines) of every function defined in the text."""
    out = []
    lines = text.split("\n")
    for m in DEF.finditer(text):
        start = text.count("\n", 0, m.start())
        end = start
        while end < len(lines) and lines[end] != "}":
            end += 1
        out.append((m.group(1), start + 1, end - start + 1))
    return out


def folder_problems(parts):
    """Check 4: each folder's parts one run of the manifest; no part of src/ left out."""
    problems, seen, last = [], set(), None
    for p in parts:
        folder = os.path.dirname(p)
        if folder == "src" or folder == last:
            continue
        if folder in seen:
            problems.append(f"{p}: {folder}/ is a layer, but its parts do not come together in "
                            "the manifest")
        seen.add(folder)
        last = folder
    spec = importlib.util.spec_from_file_location("amalgamate", os.path.join(ROOT, "amalgamate.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    listed = set(mod.PARTS)
    for folder, dirs, files in os.walk(os.path.join(ROOT, "src")):
        dirs.sort()
        for name in sorted(files):
            rel = os.path.relpath(os.path.join(folder, name), ROOT)
            if name.endswith((".c", ".h", ".cl")) and rel not in listed:
                problems.append(f"{rel}: a part of src/ that the manifest does not list")
    return problems


def main():
    parts = manifest()
    wiring_accessor = "tb__wiring"
    c_parts = [p for p in parts if p.endswith(".c")]
    contracts = [p for p in parts if p.endswith(".h")]
    texts = {}
    for p in parts:
        with open(os.path.join(ROOT, p), encoding="utf-8") as f:
            texts[p] = f.read()
    stripped = {p: strip(texts[p]) for p in parts}
    defined_in = {}
    for i, p in enumerate(c_parts):
        for name, _, _ in functions(stripped[p]):
            defined_in.setdefault(name, i)
    declared = set()
    for p in contracts:
        declared.update(m.group(1) for m in DECL.finditer(stripped[p]))
    problems = []
    for i, p in enumerate(c_parts):
        own = {name for name, _, _ in functions(stripped[p])}
        backward, undeclared = {}, {}
        for ln, line in enumerate(stripped[p].split("\n"), 1):
            for m in CALL.finditer(line):
                name = m.group(1)
                j = defined_in.get(name)
                if j is None or j == i or name == wiring_accessor:
                    continue
                if j > i:
                    backward.setdefault(name, (c_parts[j], ln))
                elif name.startswith("tb__") and name not in declared and name not in own:
                    undeclared.setdefault(name, (c_parts[j], ln))
        for name, (where, ln) in sorted(backward.items()):
            problems.append(f"{p}:{ln}: calls {name}, defined in the later part {where}")
        for name, (where, ln) in sorted(undeclared.items()):
            problems.append(f"{p}:{ln}: uses {name} of {where}, which no contract part declares")
        nlines = texts[p].count("\n")
        if nlines > MAX_PART_LINES:
            problems.append(f"{p}: {nlines} lines, more than {MAX_PART_LINES}")
        for name, first, n in functions(stripped[p]):
            if n > MAX_FUNCTION_LINES:
                problems.append(f"{p}:{first}: {name} is {n} lines, more than "
                                f"{MAX_FUNCTION_LINES}")
    problems += folder_problems(parts)
    for line in problems:
        print(line)
    total = sum(len(functions(stripped[p])) for p in c_parts)
    print(f"check_layers: {len(c_parts)} parts, {total} functions, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
