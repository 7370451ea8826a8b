"""Time the search (no torch / megatron import): the code before issue 12 beside this code, in one run.

    python scripts/bench_planner.py           # every case
    python scripts/bench_planner.py --quick   # DeepSeek-V3 128K on 1,024 and 16,384 H100 only

Each measurement runs in a fresh process, so no case warms another's caches:

* ``old``: the planner as it was before issue 12 (commit OLD_COMMIT, taken from git into a temporary folder),
  ``plan(request)``;
* ``exhaustive``: this code, ``plan(request, exhaustive=True)`` (every layout priced);
* ``new``: this code, ``plan(request)`` (layouts skipped by step-time lower bounds);
* ``CLI``: ``python -m lcmoe_recipes.plan ... --top 5`` as a user runs it: Python start-up, imports, the search
  and the printing, old and new.

In-process times: the first call (cold caches) and the best of three, wall-clock seconds with the process's CPU
seconds in brackets (this machine is shared: wall exceeds CPU when other processes compete for its cores).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OLD_COMMIT = "2d0ae9f591afbc26ec5bf9c52e989af38b75dc3d"  # main before issue 12 (2026-11-30)
HEADLINE = [("dsv3", 131072, "h100", 1024), ("dsv3", 131072, "h100", 16384)]
CASES = HEADLINE + [("qwen3_235b", 131072, "gb200", 16384), ("dsv3", 32768, "h100", 1024),
                    ("qwen3_235b", 65536, "gb200", 1024), ("qwen3_next", 131072, "h200", 1024),
                    ("qwen3_235b", 131072, "gb200", 128), ("course_moe", 32768, "h200", 64)]


def worker(mode: str, model: str, seq: int, hardware: str, gpus: int) -> None:
    """In a fresh process: time the imports and plan() (first call, best of 3); print one JSON line."""
    t0 = time.perf_counter()
    if mode == "old":
        from lcmoe_recipes.planner import plan  # the module's name before the search was split out
    else:
        from lcmoe_recipes.planner.search import plan
    from lcmoe_recipes.core.request import TrainingRequest

    imports = time.perf_counter() - t0
    request = TrainingRequest(model=model, seq_length=seq, hardware=hardware, num_gpus=gpus)
    runs = []
    for _ in range(3):
        wall, cpu = time.perf_counter(), time.process_time()
        result = plan(request, exhaustive=True) if mode == "exhaustive" else plan(request)
        runs.append((time.perf_counter() - wall, time.process_time() - cpu))
    print(json.dumps({"imports": imports, "first": runs[0], "best": min(runs), "considered": result.considered,
                      "winner": result.best.plan.layout.describe().split(" on ")[0]}))


def _in_process(src: Path, mode: str, case) -> dict:
    out = subprocess.run([sys.executable, __file__, "--worker", mode, *map(str, case)], capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": str(src)}, check=True)
    return json.loads(out.stdout.splitlines()[-1])


def _cli(src: Path, case) -> tuple[float, float]:
    """Best of three (wall, CPU) seconds of the plan command."""
    model, seq, hardware, gpus = case
    best = None
    for _ in range(3):
        before, wall = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        subprocess.run([sys.executable, "-m", "lcmoe_recipes.plan", model, "--seq", str(seq), "--gpus", str(gpus),
                        "--hardware", hardware, "--top", "5"], capture_output=True, check=True,
                       env={**os.environ, "PYTHONPATH": str(src)})
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        took = (time.perf_counter() - wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        best = took if best is None or took < best else best
    return best


def _old_source(folder: Path) -> Path | None:
    """The package at OLD_COMMIT, unpacked into ``folder``; None when this checkout's git lacks the commit."""
    archive = folder / "old.tar"
    with open(archive, "wb") as handle:
        made = subprocess.run(["git", "-C", str(ROOT), "archive", OLD_COMMIT, "src/lcmoe_recipes"], stdout=handle,
                              stderr=subprocess.DEVNULL)
    if made.returncode:
        return None
    with tarfile.open(archive) as tar:
        tar.extractall(folder, filter="data")
    return folder / "src"


def _fmt(t) -> str:
    return f"{t[0]:.2f} ({t[1]:.2f})"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only DeepSeek-V3 128K on 1,024 and 16,384 H100")
    parser.add_argument("--worker", nargs=5, metavar=("MODE", "MODEL", "SEQ", "HW", "GPUS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        mode, model, seq, hardware, gpus = args.worker
        worker(mode, model, int(seq), hardware, int(gpus))
        return 0
    new_src = ROOT / "src"
    with tempfile.TemporaryDirectory() as tmp:
        old_src = _old_source(Path(tmp))
        print(f"old = commit {OLD_COMMIT[:10]}" + ("" if old_src else " (not in this git checkout: skipped)")
              + f"; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
        print("seconds: wall (CPU); in-process plan(): first call / best of 3; CLI: best of 3, start-up and "
              "imports included")
        header = (f"{'case':<32} {'layouts':>7}  {'old first':>12} {'old best':>12}  {'exhaustive':>12}  "
                  f"{'new first':>12} {'new best':>12}  {'CLI old':>12} {'CLI new':>12}  winner (new; = old?)")
        print(header)
        for case in (HEADLINE if args.quick else CASES):
            old = _in_process(old_src, "old", case) if old_src else None
            full = _in_process(new_src, "exhaustive", case)
            new = _in_process(new_src, "new", case)
            cli_old = _cli(old_src, case) if old_src else None
            cli_new = _cli(new_src, case)
            model, seq, hardware, gpus = case
            same = "" if old is None else (" =" if old["winner"] == new["winner"] else f" (old: {old['winner']})")
            print(f"{f'{model} {seq // 1024}K {gpus} x {hardware}':<32} {new['considered']:>7}  "
                  f"{_fmt(old['first']) if old else '-':>12} {_fmt(old['best']) if old else '-':>12}  "
                  f"{_fmt(full['best']):>12}  {_fmt(new['first']):>12} {_fmt(new['best']):>12}  "
                  f"{_fmt(cli_old) if cli_old else '-':>12} {_fmt(cli_new):>12}  {new['winner']}{same}")
        print(f"imports (new, last case): {new['imports']:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
