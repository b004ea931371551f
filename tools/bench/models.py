#!/usr/bin/env python3
"""The benchmark's `models` family: real models and training runs, ours beside PyTorch eager.

    python3 tools/bench/models.py [--quick] [--json FILE] [--backends opencl,native]
                                  [--models LIST] [--training | --no-training] [--rounds N]

Rows (one per case and backend; PyTorch runs on the native backend's threads, with OpenBLAS
when the system's BLAS alternative is OpenBLAS, which the first line says). Every case runs
in N rounds (--rounds, default 3): each round runs ours on each backend and then PyTorch, and
PyTorch also runs once before the first round; a row is the median over the rounds of each
run's time, and its note gives the runs' range. A slow stretch of a shared machine thus falls
on every side alike, where one run of each side apart could differ by half.
  models_<M>      a cached forward of torchvision's ResNet-18, ResNet-50, MobileNetV2,
                  SqueezeNet 1.0 (batch 8, 224x224) or a TransformerEncoder (d_model 128, 2
                  layers, [8, 64, 128]): a run's time is the median of its cached forwards
                  (examples/models.c; 5 of each CNN, 300 of the encoder, whose 2-5 ms
                  forward is within the noise of these machines over 5, and whose difference
                  between the C example and tb_fx, about a tenth of a millisecond, within it
                  over 50), PyTorch's the median of as many (tools/export_model.py); ours
                  must match PyTorch's output within 1e-5 of its scale or the row fails.
  fx_<M>          the same model, input and PyTorch run through tools/tb_fx.py (the module
                  compiled by the library from PyTorch), in the same rounds: its median cached
                  call, inputs uploaded and outputs downloaded, beside PyTorch; the note (and
                  the JSON's anchor) gives the C example's time and C / tb_fx, also round by
                  round (the C example and tb_fx of one round ran one after the other).
  coldstart_<M>   the same model's first forward in the first round, a fresh process with
                  empty caches (our TB_CACHE_DIR and PoCL's POCL_CACHE_DIR new folders, which
                  the later rounds reuse): the compile of its kernels and one run; the note
                  gives the cached forward, the time its batch norms took to fold (compiled
                  first, outside this row), the forward's kernels, how many are distinct (each
                  compiled once) and how many a cached forward launches.
  train_cnn_epoch examples/train_cnn.c's CNN on Fashion-MNIST, one epoch of 6,400 images
                  (kernels compiled beforehand by a short run that shares the cache), beside
                  tools/bench/train_cnn_torch.py: epoch seconds.
  gpt_step        examples/gpt.c's GPT (nanoGPT's CPU configuration), the mean step time of
                  iterations 21-40 (the first 20 include the first round's compile), beside
                  tools/bench/gpt_torch.py.
  fx_train_resnet18  a training step of ResNet-18 (batch 8, 224x224: forward, cross entropy,
                  backward, SGD) through tools/tb_fx.py beside the same in PyTorch eager
                  (tools/bench/fx_train.py): the median of 10 steps after 3 warm-up steps; the
                  first step's loss must match PyTorch's or the row fails.
--quick: ResNet-18 only, batch 1 at 64x64, 2 repetitions, one round, no training rows (a
smoke run).
Each row prints `case backend ours pytorch pytorch/ours note`; with --json each is also one
JSON object per line, in the fields of tools/bench.sh's rows (unknown ones null) plus "note".
Exit status 1 when a run fails or a model's output is off; standard library only.
"""
import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TORCH_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "68719476736",
             "OMP_WAIT_POLICY": "PASSIVE"}
FIELDS = ("case", "backend", "ours", "pytorch", "ratio_pytorch", "bound", "bound_kind",
          "frac_bound", "rate", "unit", "anchor_name", "anchor", "ratio_anchor", "bytes", "flops",
          "reps")


def run(cmd, env=None, timeout=3600):
    """(exit status, stdout, stderr) of cmd."""
    full = dict(os.environ)
    full.update(env or {})
    p = subprocess.run(cmd, cwd=ROOT, env=full, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def threads():
    n = os.environ.get("TB_NATIVE_THREADS")
    return int(n) if n and n.isdigit() and int(n) > 0 else len(os.sched_getaffinity(0))


def build(name, out):
    cc = os.environ.get("CC", "gcc").split()
    cmd = cc + ["-std=c99", "-O2", "-I.", "examples/%s.c" % name, "-o", out, "-ldl", "-lpthread",
                "-lm"]
    rc, _, err = run(cmd)
    if rc != 0:
        sys.exit("models: examples/%s.c does not build:\n%s" % (name, err))


class Rows:
    def __init__(self, json_path):
        self.json_path = json_path
        self.failed = False
        print("%-22s %-7s %12s %12s %8s  %s" % ("case", "backend", "ours", "pytorch", "pt/ours",
                                              "note"))

    def add(self, case, backend, ours, pytorch, unit, note, reps, anchor=None):
        ratio = pytorch / ours if ours and pytorch else None
        show = (lambda v: "-" if v is None else
                ("%.2f ms" % (v * 1e3) if unit == "ms" else "%.2f s" % v))
        print("%-22s %-7s %12s %12s %8s  %s" % (case, backend, show(ours), show(pytorch),
                                              "-" if ratio is None else "%.2f" % ratio, note),
              flush=True)
        if self.json_path:
            row = dict.fromkeys(FIELDS)
            row.update(case=case, backend=backend, ours=ours, pytorch=pytorch,
                       ratio_pytorch=ratio, reps=reps, note=note)
            if anchor is not None:
                row.update(anchor_name=anchor[0], anchor=anchor[1],
                           ratio_anchor=anchor[1] / ours if ours else None)
            with open(self.json_path, "a") as f:
                f.write(json.dumps(row) + "\n")

    def fail(self, what):
        print("models: FAIL %s" % what, flush=True)
        self.failed = True


def median(values):
    s = sorted(values)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def spread(values, scale, unit):
    """'a-b unit over N runs' of values (seconds) times scale, or the one value."""
    if len(values) == 1:
        return "%.2f %s" % (values[0] * scale, unit)
    return "%.2f-%.2f %s over %d runs" % (min(values) * scale, max(values) * scale, unit,
                                          len(values))


def torch_ms(model, batch, size, reps, nthreads, out=None):
    """(PyTorch's median forward in seconds, why not) (exporting the model to `out` when
    given, with PyTorch's time and output stored in it)."""
    cmd = ["/usr/bin/python3", "tools/export_model.py", model, out or os.devnull,
           "--batch", str(batch), "--size", str(size), "--time", str(reps),
           "--threads", str(nthreads)]
    if out is None:
        cmd.append("--time-only")
    rc, so, se = run(cmd, TORCH_ENV)
    m = re.search(r"torch_ms ([0-9.]+)", so)
    if rc != 0 or m is None:
        return None, (se or so).strip()[-300:]
    return float(m.group(1)) / 1e3, ""


def parse_models(text):
    """What examples/models.c printed, as a dict."""
    r = {}
    m = re.search(r"first forward ([0-9.]+) s, cached forward ([0-9.]+) ms.*?"
                  r"error / output scale (\S+)", text)
    if m:
        r.update(first=float(m.group(1)), cached=float(m.group(2)) / 1e3, error=m.group(3))
    m = re.search(r"weights folded in ([0-9.]+) s; the forward: (\d+) kernels, (\d+) distinct, "
                  r"(\d+) launched", text)
    if m:
        r.update(fold=float(m.group(1)), kernels=int(m.group(2)), compiled=int(m.group(3)),
                 launched=int(m.group(4)))
    return r


def model_rows(rows, work, binary, model, batch, size, reps, backends, nthreads, rounds):
    """A model's rows. Each of `rounds` rounds runs, in turn, the C example on each backend, the
    same through tools/tb_fx.py on each backend, and PyTorch (which also runs once before the
    first): each row is the median over the rounds of each run's median, so that a stretch of
    the machine's noise falls on every side alike. The first round starts from empty caches
    (the coldstart rows); the later ones reuse them, as a user's second run would."""
    path = os.path.join(work, model + ".safetensors")
    t, why = torch_ms(model, batch, size, reps, nthreads, out=path)
    if t is None:
        rows.fail("%s: tools/export_model.py: %s" % (model, why))
        return
    pt, first, c_ms, fx_ms, fx_err = [t], {}, {}, {}, {}
    live_c, live_fx = list(backends), list(backends)
    with fresh_caches(["c_" + b for b in backends] + ["fx_" + b for b in backends]) as env:
        for k in range(rounds):
            for b in list(live_c):
                rc, so, se = run([binary, path, "--device", b + ":0", "--reps", str(reps)],
                                 env["c_" + b])
                r = parse_models(so)
                if rc != 0 or "first" not in r:
                    rows.fail("%s on %s: exit status %d: %s" % (model, b, rc,
                                                                (se or so).strip()[-400:]))
                    live_c.remove(b)
                    continue
                first.setdefault(b, r)
                c_ms.setdefault(b, []).append(r["cached"])
            for b in list(live_fx):
                fenv = dict(env["fx_" + b])
                fenv.update(TORCH_ENV)
                rc, so, se = run(["/usr/bin/python3", "tools/export_model.py", model,
                                  os.devnull, "--batch", str(batch), "--size", str(size),
                                  "--time", str(reps), "--threads", str(nthreads),
                                  "--time-only", "--tb-fx", b + ":0"], fenv)
                m = re.search(r"tb_fx_ms ([0-9.]+) first_s ([0-9.]+) error (\S+)", so)
                if rc != 0 or m is None:
                    rows.fail("fx_%s on %s: tools/export_model.py --tb-fx: %s" % (
                        model, b, (se or so).strip()[-400:]))
                    live_fx.remove(b)
                    continue
                fx_ms.setdefault(b, []).append(float(m.group(1)) / 1e3)
                fx_err[b] = max(fx_err.get(b, 0.0), float(m.group(3)))
            t, _ = torch_ms(model, batch, size, reps, nthreads)
            if t is not None:
                pt.append(t)
    p = median(pt)
    for b in backends:
        if b in c_ms:
            note = "error/scale %s; ours %s, PyTorch %s" % (
                first[b]["error"], spread(c_ms[b], 1e3, "ms"), spread(pt, 1e3, "ms"))
            rows.add("models_" + model, b, median(c_ms[b]), p, "ms", note, reps * len(c_ms[b]))
    for b in backends:
        if b not in fx_ms:
            continue
        if fx_err[b] > 1e-5:
            rows.fail("fx_%s on %s: error / output scale %.1e" % (model, b, fx_err[b]))
        fx = median(fx_ms[b])
        note = "through tools/tb_fx.py: error/scale %.1e; tb_fx %s" % (
            fx_err[b], spread(fx_ms[b], 1e3, "ms"))
        anchor = None
        if b in c_ms:
            c = median(c_ms[b])
            note += "; the C example %.2f ms, C / tb_fx %.2f" % (c * 1e3, c / fx)
            if len(c_ms[b]) == len(fx_ms[b]) > 1:
                note += " (round by round: %s)" % ", ".join(
                    "%.2f" % (x / y) for x, y in zip(c_ms[b], fx_ms[b]))
            anchor = ("examples/models.c", c)
        rows.add("fx_" + model, b, fx, p, "ms", note, reps * len(fx_ms[b]), anchor)
    for b in backends:
        if b not in first:
            continue
        r = first[b]
        note = ("cached forward %.2f ms; batch norms folded in %.2f s; %d kernels, %d distinct "
                "(each compiled once), %d launched per cached forward" % (
                    median(c_ms[b]) * 1e3, r.get("fold", 0), r.get("kernels", 0),
                    r.get("compiled", 0), r.get("launched", 0)))
        rows.add("coldstart_" + model, b, r["first"], None, "s", note, 1)


@contextlib.contextmanager
def fresh_caches(names):
    """{name: the environment of runs with empty caches of their own (ours and PoCL's)}, each
    in a folder of its own, all removed after."""
    folder = tempfile.mkdtemp(prefix="tb_bench_models_")
    try:
        yield {n: {"TB_CACHE_DIR": os.path.join(folder, n, "tb"),
                   "POCL_CACHE_DIR": os.path.join(folder, n, "pocl")} for n in names}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def last_float(pattern, text):
    found = re.findall(pattern, text)
    return float(found[-1]) if found else None


def timed(rows, cmd, env, pattern, scale, what):
    """The number `pattern` finds last in what cmd printed, times scale (seconds), or None
    (the row then fails, naming `what` and the end of the output)."""
    rc, so, se = run(cmd, env)
    t = last_float(pattern, so) if rc == 0 else None
    if t is None:
        rows.fail("%s: %s" % (what, (se or so).strip()[-300:]))
        return None
    return t * scale


def train_rows(rows, case, backends, rounds, torch_run, ours_run, unit, note, reps):
    """A training case's rows: PyTorch's run, then `rounds` rounds of ours on each backend and
    PyTorch again; each row is the median over the rounds (caches shared by the rounds, so
    only the first compiles)."""
    pt, ours = [], {}
    t = torch_run()
    if t is not None:
        pt.append(t)
    live = list(backends)
    with fresh_caches(live) as env:
        for _ in range(rounds):
            for b in list(live):
                got = ours_run(b, env[b])
                if got is None:
                    live.remove(b)
                    continue
                ours.setdefault(b, []).append(got)
            t = torch_run()
            if t is not None:
                pt.append(t)
    scale, name = (1.0, "s") if unit == "s" else (1e3, "ms")
    for b in backends:
        if b in ours:
            rows.add(case, b, median(ours[b]), median(pt) if pt else None, unit,
                     "%s; ours %s, PyTorch %s" % (note, spread(ours[b], scale, name),
                                                  spread(pt, scale, name) if pt else "-"),
                     reps * len(ours[b]))


def train_cnn_rows(rows, work, backends, nthreads, rounds):
    binary = os.path.join(work, "train_cnn")
    build("train_cnn", binary)
    images = "6400"
    warm = set()

    def torch_run():
        return timed(rows, ["/usr/bin/python3", "tools/bench/train_cnn_torch.py", "1",
                            "--images", images, "--threads", str(nthreads)], TORCH_ENV,
                     r"images/s\s+([0-9.]+) s", 1.0, "train_cnn_torch.py")

    def ours_run(b, env):
        if b not in warm:  # compiles the kernels into the rounds' cache, untimed
            warm.add(b)
            run([binary, "1", "--images", "512", "--test-images", "128", "--device", b + ":0"],
                env)
        return timed(rows, [binary, "1", "--images", images, "--test-images", "128",
                            "--device", b + ":0"], env, r"images/s\s+([0-9.]+) s", 1.0,
                     "train_cnn on %s" % b)

    train_rows(rows, "train_cnn_epoch", backends, rounds, torch_run, ours_run, "s",
               "%s images, batch 128, AdamW" % images, 1)


def gpt_rows(rows, work, backends, nthreads, rounds):
    binary = os.path.join(work, "gpt")
    build("gpt", binary)
    args = ["--iters", "40", "--eval-every", "20"]
    step = r"([0-9.]+) ms per iteration"

    def torch_run():
        return timed(rows, ["/usr/bin/python3", "tools/bench/gpt_torch.py", "--threads",
                            str(nthreads)] + args, TORCH_ENV, step, 1e-3, "gpt_torch.py")

    def ours_run(b, env):
        return timed(rows, [binary, "--device", b + ":0"] + args, env, step, 1e-3,
                     "gpt on %s" % b)

    train_rows(rows, "gpt_step", backends, rounds, torch_run, ours_run, "ms",
               "the mean of iterations 21-40 of a run", 20)


def fx_train_rows(rows, backends, nthreads, rounds):
    args = ["--batch", "8", "--size", "224", "--steps", "10", "--threads", str(nthreads)]
    script, step = ["/usr/bin/python3", "tools/bench/fx_train.py"], r"step_ms ([0-9.]+)"

    def torch_run():
        return timed(rows, script + ["torch"] + args, TORCH_ENV, step, 1e-3, "fx_train.py torch")

    def ours_run(b, env):
        return timed(rows, script + [b + ":0"] + args, env, step, 1e-3, "fx_train.py on %s" % b)

    train_rows(rows, "fx_train_resnet18", backends, rounds, torch_run, ours_run, "ms",
               "batch 8, 224x224, SGD, the median of 10 steps", 10)


def blas_of_torch():
    rc, so, _ = run(["/usr/bin/python3", "-c",
                     "import torch; print(torch.__config__.show())"], TORCH_ENV)
    if rc != 0:
        return None
    target = os.path.realpath("/usr/lib/x86_64-linux-gnu/libblas.so.3")
    return "%s (libblas.so.3 -> %s)" % ("OpenBLAS" if "openblas" in target else
                                        "not OpenBLAS", target)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--backends", default="opencl,native")
    ap.add_argument("--models", default="resnet18,resnet50,mobilenet_v2,squeezenet1_0,encoder")
    ap.add_argument("--training", dest="training", action="store_true", default=None)
    ap.add_argument("--no-training", dest="training", action="store_false")
    ap.add_argument("--rounds", type=int, default=0)
    a = ap.parse_args()
    if a.rounds < 0:
        ap.error("--rounds: a count of rounds, at least 1")
    rc, _, _ = run(["/usr/bin/python3", "-c", "import torch, torchvision"])
    if rc != 0:
        print("models: skipped: /usr/bin/python3 cannot import torch and torchvision "
              "(python3-torch, python3-torchvision)")
        return 0
    nthreads = threads()
    print("models: PyTorch on %d threads, BLAS: %s" % (nthreads, blas_of_torch()), flush=True)
    work = tempfile.mkdtemp(prefix="tb_bench_models_")
    rows = Rows(a.json)
    try:
        binary = os.path.join(work, "models")
        build("models", binary)
        backends = [b for b in a.backends.split(",") if b]
        rounds = a.rounds or (1 if a.quick else 3)
        if a.quick:
            model_rows(rows, work, binary, "resnet18", 1, 64, 2, backends, nthreads, rounds)
        else:
            for m in a.models.split(","):
                batch, size, reps = (8, 64, 300) if m == "encoder" else (8, 224, 5)
                model_rows(rows, work, binary, m, batch, size, reps, backends, nthreads, rounds)
        if a.training if a.training is not None else not a.quick:
            train_cnn_rows(rows, work, backends, nthreads, rounds)
            gpt_rows(rows, work, backends, nthreads, rounds)
            fx_train_rows(rows, backends, nthreads, rounds)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if rows.failed else 0


if __name__ == "__main__":
    sys.exit(main())
