#!/usr/bin/env python3
"""The README's performance table from one run of the benchmark's --json output.

Usage: python3 tools/bench_table.py FILE        (FILE from `bash tools/bench.sh --json FILE`)

Prints, in Markdown: a line naming the machine (CPU, threads, OpenCL device, PyTorch, OpenBLAS,
measured bandwidth), then one row per (case, backend) in the order the run wrote them: our time,
PyTorch's and PyTorch / ours (above 1: we are faster), the bound and the fraction of it we reach,
our rate, and the anchor with anchor / ours. Standard library only. Exit status 1 when the file
holds no machine line or no rows.
"""
import json
import sys


def fmt_time(t):
    if t is None:
        return "-"
    if t >= 1.0:
        return "%.2f s" % t
    if t >= 1e-3:
        return "%.2f ms" % (t * 1e3)
    return "%.1f us" % (t * 1e6)


def fmt_ratio(r):
    return "-" if r is None else "%.2f" % r


def read_objects(text):
    """Every JSON object in text (one a line, or written back to back)."""
    dec = json.JSONDecoder()
    i, out = 0, []
    while True:
        while i < len(text) and text[i] in " \t\r\n":
            i += 1
        if i >= len(text):
            return out
        obj, i = dec.raw_decode(text, i)
        out.append(obj)


def machine_line(m):
    gb = 1e9
    parts = ["%s, %s cores online, %s threads" % (m.get("cpu"), m.get("cores"), m.get("threads"))]
    if m.get("opencl"):
        parts.append("OpenCL device %s" % m.get("opencl_device"))
    if m.get("pytorch"):
        parts.append(m.get("pytorch_about"))
    parts.append(m.get("openblas"))
    parts.append("bandwidth read %.1f, copy %.1f (non-temporal stores %.1f), triad %.1f GB/s" %
                 (m.get("bandwidth_read", 0) / gb, m.get("bandwidth_copy", 0) / gb,
                  m.get("bandwidth_copy_stream", 0) / gb, m.get("bandwidth_triad", 0) / gb))
    if m.get("quick"):
        parts.append("--quick sizes")
    return "Machine: " + "; ".join(p for p in parts if p) + "; torch_backend.h %s." % m.get(
        "version")


def main(argv):
    if len(argv) != 2:
        sys.stderr.write(__doc__)
        return 2
    with open(argv[1], encoding="utf-8") as f:
        objs = read_objects(f.read())
    machine = [o for o in objs if o.get("case") == "machine"]
    rows = [o for o in objs if o.get("case") != "machine"]
    if not machine or not rows:
        sys.stderr.write("bench_table: %s holds %s\n" %
                         (argv[1], "no machine line" if not machine else "no rows"))
        return 1
    print(machine_line(machine[0]))
    print()
    print("| case | backend | ours | PyTorch | PyTorch / ours | bound | of bound | rate | anchor "
          "| anchor / ours |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |")
    for r in rows:
        frac = r.get("frac_bound")
        rate = r.get("rate")
        print("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r.get("case"), r.get("backend"), fmt_time(r.get("ours")), fmt_time(r.get("pytorch")),
            fmt_ratio(r.get("ratio_pytorch")),
            fmt_time(r.get("bound")) if r.get("bound") is not None else "-",
            "-" if frac is None else "%.0f%%" % (100.0 * frac),
            "-" if rate is None else "%.1f %s" % (rate, r.get("unit") or ""),
            r.get("anchor_name") or "-", fmt_ratio(r.get("ratio_anchor"))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
