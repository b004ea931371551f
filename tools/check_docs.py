#!/usr/bin/env python3
"""Check that the documentation names every environment variable and configuration macro the
code reads, and nothing the code does not read.

    python3 tools/check_docs.py          report, exit 1 on a finding

Environment variables are the names given to a function whose name contains "env" (tb__getenv,
tb__env_level, ...) in src/. Each of the library's own (TB_*, CC and the drivers' ones it reads,
such as POCL_*) must have a row in README.md's table under "## Environment variables" and a
line in the ENVIRONMENT VARIABLES section of the header's comment (src/header_begin.h); the
system's (HOME, PATH, TMPDIR, XDG_CACHE_HOME, and the MPI launchers' rank variables) must be
named somewhere in README.md. Every row of README.md's table must be a variable the code reads.

The lines of README.md's diff blocks (```diff, each file opened by a "--- PATH" line) that
are kept or added (" " or "+") must be lines of that file as it is now, so that an example of
a change to the sources (adding an op) does not drift from them.

Configuration macros are the TB_* names (not TB__*) that src/ tests with #if defined, #ifdef or
#ifndef outside string literals (kernel code is text); each must be named in README.md and in
the header's USAGE and CONFIGURATION MACROS sections. Standard library only.
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SYSTEM = {"HOME", "PATH", "TMPDIR", "XDG_CACHE_HOME", "OMPI_COMM_WORLD_RANK", "PMI_RANK"}
INTERNAL_MACROS = {"TB_IMPLEMENTATION_DONE"}  # the header's own include guard for its body


def read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


def sources():
    """(path under src/, text) of every .c and .h file of src/ and its folders."""
    top = os.path.join(ROOT, "src")
    for folder, dirs, files in sorted(os.walk(top)):
        dirs.sort()
        for name in sorted(files):
            if name.endswith((".c", ".h")):
                rel = os.path.relpath(os.path.join(folder, name), top)
                yield rel, read(os.path.join("src", rel))


def strip(text):
    """The text without comments and string literals."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r'"(\\.|[^"\\\n])*"', '""', text)


def section(text, start, end):
    i = text.find(start)
    if i < 0:
        return ""
    j = text.find(end, i + len(start))
    return text[i:j if j >= 0 else len(text)]


def main():
    readme = read("README.md")
    header = read("src/header_begin.h")
    env_table = section(readme, "## Environment variables", "\n## ")
    header_env = section(header, "ENVIRONMENT VARIABLES", "ERRORS")
    header_config = section(header, "USAGE", "ENVIRONMENT VARIABLES")
    rows = set(re.findall(r"^\| `([A-Z][A-Z0-9_]*)`", env_table, re.M))
    read_vars, macros = {}, {}
    for name, text in sources():
        for v in re.findall(r"\b\w*env\w*\(\s*\"([A-Z][A-Z0-9_]*)\"", strip_comments(text)):
            read_vars.setdefault(v, name)
        for m in re.findall(r"(?:defined\s*\(\s*|#\s*ifn?def\s+)(TB_[A-Z][A-Z0-9_]*)", strip(text)):
            if not m.startswith("TB__") and m not in INTERNAL_MACROS:
                macros.setdefault(m, name)
    problems = []
    for v, where in sorted(read_vars.items()):
        if v in SYSTEM:
            if not re.search(r"\b%s\b" % v, readme):
                problems.append("%s (read in src/%s) is not named in README.md" % (v, where))
            continue
        if v not in rows:
            problems.append("%s (read in src/%s) has no row in README.md's table of environment "
                            "variables" % (v, where))
        if not re.search(r"\b%s\b" % v, header_env):
            problems.append("%s (read in src/%s) is not in src/header_begin.h's ENVIRONMENT "
                            "VARIABLES" % (v, where))
    for v in sorted(rows - set(read_vars)):
        problems.append("README.md's table lists %s, which the code does not read" % v)
    for m, where in sorted(macros.items()):
        if not re.search(r"\b%s\b" % m, readme):
            problems.append("configuration macro %s (src/%s) is not named in README.md" %
                            (m, where))
        if not re.search(r"\b%s\b" % m, header_config):
            problems.append("configuration macro %s (src/%s) is not in src/header_begin.h's "
                            "USAGE or CONFIGURATION MACROS" % (m, where))
    problems += diff_problems(readme)
    for p in problems:
        print("check_docs: " + p)
    print("check_docs: %d environment variables, %d configuration macros, %d problem(s)" %
          (len(read_vars), len(macros), len(problems)))
    return 1 if problems else 0


def diff_problems(readme):
    """Lines of README.md's diff blocks that are not (any longer) in the file they name."""
    problems, path, lines = [], None, None
    for block in re.findall(r"^```diff\n(.*?)^```", readme, re.M | re.S):
        for line in block.split("\n"):
            if line.startswith("--- "):
                path = line[4:].strip()
                try:
                    lines = set(read(path).split("\n"))
                except OSError:
                    problems.append("README.md's diff names %s, which does not exist" % path)
                    lines = None
            elif line[:1] in (" ", "+") and lines is not None and line[1:] not in lines:
                problems.append("README.md's diff of %s has a line that is not in it: %s" %
                                (path, line[1:].strip()[:60]))
    return problems


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


if __name__ == "__main__":
    sys.exit(main())
