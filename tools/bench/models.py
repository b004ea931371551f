#!/usr/bin/env python3
"""The benchmark's `models` family: real models and training runs, ours beside PyTorch eager.

    python3 tools/bench/models.py [--quick] [--json FILE] [--backends opencl,native]
                                  [--models LIST] [--training | --no-training]

Rows (one per case and backend; PyTorch runs on the native backend's threads, with OpenBLAS
when the system's BLAS alternative is OpenBLAS, which the first line says):
  models_<M>      a cached forward of torchvision's ResNet-18, ResNet-50, MobileNetV2,
                  SqueezeNet 1.0 (batch 8, 224x224) or a TransformerEncoder (d_model 128, 2
                  layers, [8, 64, 128]): the median of our cached forwards (examples/models.c;
                  5 of each CNN, 50 of the encoder, whose 2-5 ms forward is within the noise
                  of these machines over 5) beside the mean of two medians of PyTorch's (tools/export_model.py), one
                  taken before ours and one after; ours must match PyTorch's output within
                  1e-5 of its scale or the row fails.
  fx_<M>          the same model, input and PyTorch run through tools/tb_fx.py (the module
                  compiled by the library from PyTorch): its median cached call, inputs
                  uploaded and outputs downloaded, beside PyTorch; the note (and the JSON's
                  anchor) gives the C example's time and C / tb_fx.
  coldstart_<M>   the same model's first forward in a fresh process with empty caches (our
                  TB_CACHE_DIR and PoCL's POCL_CACHE_DIR new folders): the compile of its kernels
                  and one run; the note gives the cached forward, the time its batch norms
                  took to fold (compiled first, outside this row), the forward's kernels,
                  how many are distinct (each compiled once) and how many a cached forward
                  launches.
  train_cnn_epoch examples/train_cnn.c's CNN on Fashion-MNIST, one epoch of 6,400 images
                  (kernels compiled beforehand by a short run that shares the cache), beside
                  tools/bench/train_cnn_torch.py: epoch seconds.
  gpt_step        examples/gpt.c's GPT (nanoGPT's CPU configuration), the mean step time of
                  iterations 21-40 (the first 20 include the compile), beside
                  tools/bench/gpt_torch.py.
--quick: ResNet-18 only, batch 1 at 64x64, 2 repetitions, no training rows (a smoke run).
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


def torch_ms(model, batch, size, reps, nthreads, out=None):
    """PyTorch's median forward in ms (exporting the model to `out` when given), or None."""
    cmd = ["/usr/bin/python3", "tools/export_model.py", model, out or os.devnull,
           "--batch", str(batch), "--size", str(size), "--time", str(reps),
           "--threads", str(nthreads)]
    if out is None:
        cmd.append("--time-only")
    rc, so, se = run(cmd, TORCH_ENV)
    if rc != 0:
        return None, se.strip()[-300:]
    if out is None:
        m = re.search(r"torch_ms ([0-9.]+)", so)
        return (float(m.group(1)) if m else None), ""
    return -1.0, ""


def parse_models(text):
    """What examples/models.c printed, as a dict."""
    r = {}
    m = re.search(r"first forward ([0-9.]+) s, cached forward ([0-9.]+) ms.*?PyTorch ([0-9.]+) ms"
                  r".*?error / output scale (\S+)", text)
    if m:
        r.update(first=float(m.group(1)), cached=float(m.group(2)) / 1e3,
                 torch=float(m.group(3)) / 1e3, error=m.group(4))
    m = re.search(r"weights folded in ([0-9.]+) s; the forward: (\d+) kernels, (\d+) distinct, "
                  r"(\d+) launched", text)
    if m:
        r.update(fold=float(m.group(1)), kernels=int(m.group(2)), compiled=int(m.group(3)),
                 launched=int(m.group(4)))
    return r


def model_rows(rows, work, binary, model, batch, size, reps, backends, nthreads):
    path = os.path.join(work, model + ".safetensors")
    ok, why = torch_ms(model, batch, size, reps, nthreads, out=path)
    if ok is None:
        rows.fail("%s: tools/export_model.py: %s" % (model, why))
        return
    results = {}
    for b in backends:
        with fresh_caches() as env:
            rc, so, se = run([binary, path, "--device", b + ":0", "--reps", str(reps)], env)
        r = parse_models(so)
        if rc != 0 or "first" not in r:
            rows.fail("%s on %s: exit status %d: %s" % (model, b, rc, (se or so).strip()[-400:]))
            continue
        results[b] = r
    again, _ = torch_ms(model, batch, size, reps, nthreads)
    for b, r in results.items():
        pt = r["pt"] = r["torch"] if again is None else (r["torch"] + again / 1e3) / 2
        note = "error/scale %s; PyTorch %.2f and %s ms" % (
            r["error"], r["torch"] * 1e3, "-" if again is None else "%.2f" % again)
        rows.add("models_" + model, b, r["cached"], pt, "ms", note, reps)
    for b, r in results.items():
        # the same model and input through tools/tb_fx.py (PyTorch's module compiled by the
        # library), beside the C example's cached forward
        with fresh_caches() as env:
            env.update(TORCH_ENV)
            rc, so, se = run(["/usr/bin/python3", "tools/export_model.py", model, os.devnull,
                              "--batch", str(batch), "--size", str(size), "--time", str(reps),
                              "--threads", str(nthreads), "--time-only", "--tb-fx", b + ":0"],
                             env)
        m = re.search(r"tb_fx_ms ([0-9.]+) first_s ([0-9.]+) error (\S+)", so)
        if rc != 0 or m is None:
            rows.fail("fx_%s on %s: tools/export_model.py --tb-fx: %s" % (
                model, b, (se or so).strip()[-400:]))
            continue
        fx, err = float(m.group(1)) / 1e3, float(m.group(3))
        if err > 1e-5:
            rows.fail("fx_%s on %s: error / output scale %.1e" % (model, b, err))
        rows.add("fx_" + model, b, fx, r["pt"], "ms",
                 "through tools/tb_fx.py: error/scale %.1e; the C example %.2f ms, C / tb_fx "
                 "%.2f" % (err, r["cached"] * 1e3, r["cached"] / fx), reps,
                 ("examples/models.c", r["cached"]))
    for b, r in results.items():
        note = ("cached forward %.2f ms; batch norms folded in %.2f s; %d kernels, %d distinct "
                "(each compiled once), %d launched per cached forward" % (
                    r["cached"] * 1e3, r.get("fold", 0), r.get("kernels", 0),
                    r.get("compiled", 0), r.get("launched", 0)))
        rows.add("coldstart_" + model, b, r["first"], None, "s", note, 1)


@contextlib.contextmanager
def fresh_caches():
    """The environment of runs with empty caches of their own (ours and PoCL's), removed after."""
    folder = tempfile.mkdtemp(prefix="tb_bench_models_")
    try:
        yield {"TB_CACHE_DIR": os.path.join(folder, "tb"),
               "POCL_CACHE_DIR": os.path.join(folder, "pocl")}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def last_float(pattern, text):
    found = re.findall(pattern, text)
    return float(found[-1]) if found else None


def train_cnn_rows(rows, work, backends, nthreads):
    binary = os.path.join(work, "train_cnn")
    build("train_cnn", binary)
    images = "6400"
    rc, so, se = run(["/usr/bin/python3", "tools/bench/train_cnn_torch.py", "1", "--images",
                      images, "--threads", str(nthreads)], TORCH_ENV)
    pt = last_float(r"images/s\s+([0-9.]+) s", so) if rc == 0 else None
    if pt is None:
        rows.fail("train_cnn_torch.py: %s" % (se or so).strip()[-300:])
    for b in backends:
        with fresh_caches() as env:
            run([binary, "1", "--images", "512", "--test-images", "128", "--device", b + ":0"],
                env)
            rc, so, se = run([binary, "1", "--images", images, "--test-images", "128",
                              "--device", b + ":0"], env)
        ours = last_float(r"images/s\s+([0-9.]+) s", so) if rc == 0 else None
        if ours is None:
            rows.fail("train_cnn on %s: %s" % (b, (se or so).strip()[-300:]))
            continue
        rows.add("train_cnn_epoch", b, ours, pt, "s", "%s images, batch 128, AdamW" % images, 1)


def gpt_rows(rows, work, backends, nthreads):
    binary = os.path.join(work, "gpt")
    build("gpt", binary)
    args = ["--iters", "40", "--eval-every", "20"]
    rc, so, se = run(["/usr/bin/python3", "tools/bench/gpt_torch.py", "--threads",
                      str(nthreads)] + args, TORCH_ENV)
    pt = last_float(r"([0-9.]+) ms per iteration", so) if rc == 0 else None
    if pt is None:
        rows.fail("gpt_torch.py: %s" % (se or so).strip()[-300:])
    for b in backends:
        with fresh_caches() as env:
            rc, so, se = run([binary, "--device", b + ":0"] + args, env)
        ours = last_float(r"([0-9.]+) ms per iteration", so) if rc == 0 else None
        if ours is None:
            rows.fail("gpt on %s: %s" % (b, (se or so).strip()[-300:]))
            continue
        rows.add("gpt_step", b, ours / 1e3, None if pt is None else pt / 1e3, "ms",
                 "iterations 21-40 of a fresh run", 20)


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
    a = ap.parse_args()
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
        if a.quick:
            model_rows(rows, work, binary, "resnet18", 1, 64, 2, backends, nthreads)
        else:
            for m in a.models.split(","):
                batch, size, reps = (8, 64, 50) if m == "encoder" else (8, 224, 5)
                model_rows(rows, work, binary, m, batch, size, reps, backends, nthreads)
        if a.training if a.training is not None else not a.quick:
            train_cnn_rows(rows, work, backends, nthreads)
            gpt_rows(rows, work, backends, nthreads)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if rows.failed else 0


if __name__ == "__main__":
    sys.exit(main())
