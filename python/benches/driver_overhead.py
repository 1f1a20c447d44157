"""Benchmark: a sweep through the Python driver (``python SCRIPT``) against
the same sweep as TOML with ``nestor run``. The TOML is the resolved experiment
the Python run left (``<experiment>/experiment.toml``: its seed included),
renamed, so both run the same configs with the same function: the
difference is the driver's (interpreter, the script's imports, pickling,
reading the results back). The script's own imports are timed apart.

    python python/benches/driver_overhead.py examples/python/tune_torch.py [--reps 3]

The script must take its storage and name from EXAMPLE_STORAGE and
EXAMPLE_NAME (as the examples do).
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time


# Runs the script with Tuner.fit timed (from its call to its ResultGrid).
TIMED_FIT = """
import runpy, sys, time
import nestor.tune as tune
fit = tune.Tuner.fit
def timed(self):
    start = time.perf_counter()
    grid = fit(self)
    print(f"fit {time.perf_counter() - start:.4f}", flush=True)
    return grid
tune.Tuner.fit = timed
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _imports(script: str) -> str:
    """The script's top-level import lines, as one program."""
    with open(script) as f:
        lines = [l for l in f if l.startswith(("import ", "from "))]
    return "".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("script")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    script = os.path.abspath(args.script)
    nestor = os.environ.get("NESTOR_BIN") or "nestor"
    py, toml, fit = [], [], []
    with tempfile.TemporaryDirectory() as d:
        storage = os.path.join(d, "runs")
        for rep in range(args.reps):
            env = dict(os.environ, EXAMPLE_STORAGE=storage, EXAMPLE_NAME=f"py-{rep}")
            start = time.perf_counter()
            out = subprocess.run([sys.executable, "-c", TIMED_FIT, script], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            py.append(time.perf_counter() - start)
            if out.returncode != 0:
                sys.exit(f"{script} failed:\n{out.stderr[-3000:]}")
            fit.append(float(re.search(r"^fit ([0-9.]+)$", out.stdout, re.M).group(1)))
            with open(os.path.join(storage, f"py-{rep}", "experiment.toml")) as f:
                text = re.sub(r'(?m)^name = "py-\d+"$', f'name = "toml-{rep}"', f.read(), count=1)
            path = os.path.join(d, f"toml-{rep}.toml")
            with open(path, "w") as f:
                f.write(text)
            start = time.perf_counter()
            out = subprocess.run([nestor, "run", path, "--plain"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            toml.append(time.perf_counter() - start)
            if out.returncode != 0:
                sys.exit(f"nestor run failed:\n{out.stderr[-3000:]}")
            print(f"  rep {rep + 1}: python {py[-1]:.2f} s (its fit() {fit[-1]:.2f} s), nestor run (TOML) {toml[-1]:.2f} s")
    imports = []
    for _ in range(args.reps):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", _imports(script)], check=True)
        imports.append(time.perf_counter() - start)
    print(f"  the script's imports alone (python -c ...): {statistics.median(imports):.2f} s")
    mp, mt = statistics.median(py), statistics.median(toml)
    mf = statistics.median(fit)
    print(f"median: whole python process {mp:.2f} s, TOML {mt:.2f} s: {mp - mt:+.2f} s ({(mp / mt - 1) * 100:+.1f}%)")
    print(f"median: tuner.fit() {mf:.2f} s against nestor run {mt:.2f} s: {mf - mt:+.2f} s ({(mf / mt - 1) * 100:+.1f}%)")


if __name__ == "__main__":
    main()
