"""`make demo-check`: does every demo still learn from a fresh clone? (issue 48)

Each run clones this checkout's HEAD into a folder of its own (empty caches: the warm start is built again), links
this checkout's venvs into it (their packages are the same: the install is not what is checked), runs what `make
demo` runs (tools/demo.py) with the demo's arguments, and reads the run's held-out accuracy at its first and last
validation from its `metrics.jsonl`. A run whose held-out accuracy rose by less than --min-rise, or that failed,
fails the check. Prints one row per run (start, end, best, rise, warm-start and whole wall times, the load
average) and exits 1 if any run failed. The note of every change that touches the model, its template, the
tokenizer, the tasks or the trainer's objective reports this table: CI's short tests show that the demos start,
not that they learn.

Uncommitted changes are not in the clones: commit first. Both venvs read the code of the checkout that installed
them (the clones hold the data), so run this from a checkout whose working tree is its HEAD.

    python tools/demo_check.py [--runs 3] [--demos math,calc,lora] [--min-rise 0.15] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]
DEMOS = {"math": "", "calc": "--agent calc", "lora": "--lora 8"}
VENVS = (".venv", ".venv-engine")
HELD_OUT = "val/agl/reward_mean"
# tools/demo_train.py's line once the warm start is built and measured: "model: <folder> in 65s".
BUILT = re.compile(r"^model: \S+ in (\d+)s$", re.MULTILINE)


@dataclass(frozen=True)
class Outcome:
    demo: str
    run: int
    exit_code: int
    held_out: list[tuple[int, float]]  # (step, accuracy) at each validation
    warm_start_s: float | None
    wall_s: float
    load: str

    @property
    def rise(self) -> float | None:
        return self.held_out[-1][1] - self.held_out[0][1] if len(self.held_out) > 1 else None

    def failure(self, min_rise: float) -> str | None:
        if self.exit_code != 0:
            return f"make demo exited {self.exit_code}"
        if self.rise is None:
            return "fewer than two validations in metrics.jsonl"
        if self.rise < min_rise:
            return f"held-out accuracy rose {self.rise:+.3f}, under {min_rise:+.3f}"
        return None


def held_out_accuracy(metrics_file: Path) -> list[tuple[int, float]]:
    """(step, held-out accuracy) of every validation a demo run recorded; [] if there is no file."""
    if not metrics_file.is_file():
        return []
    found = []
    for line in metrics_file.read_text().splitlines():
        record = json.loads(line)
        if HELD_OUT in record["data"]:
            found.append((int(record["step"]), float(record["data"][HELD_OUT])))
    return found


def warm_start_seconds(output: str) -> float | None:
    built = BUILT.search(output)
    return float(built[1]) if built else None


def run_one(demo: str, run: int, workdir: Path, log_dir: Path) -> Outcome:
    clone = workdir / f"{demo}-{run}"
    shutil.rmtree(clone, ignore_errors=True)
    subprocess.run(["git", "clone", "-q", str(CHECKOUT), str(clone)], check=True)
    for venv in VENVS:
        os.symlink((CHECKOUT / venv).resolve(), clone / venv)
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    started = time.monotonic()
    log = log_dir / f"{demo}-{run}.log"
    with log.open("w") as sink:
        done = subprocess.run(
            # Not `make demo`: make would see the clone's newer pyproject.toml and reinstall this checkout's venv
            # from the clone (its editable install then pointing at the clone, for every later command).
            [str(clone / ".venv" / "bin" / "python"), "tools/demo.py", *DEMOS[demo].split()],
            cwd=clone, stdout=sink, stderr=subprocess.STDOUT, check=False,
        )  # fmt: skip
    wall = time.monotonic() - started
    return Outcome(
        demo=demo,
        run=run,
        exit_code=done.returncode,
        held_out=held_out_accuracy(clone / "demo-output" / "metrics.jsonl"),
        warm_start_s=warm_start_seconds(log.read_text()),
        wall_s=wall,
        load=load,
    )


def row(outcome: Outcome, min_rise: float) -> str:
    accuracy = outcome.held_out
    start = f"{accuracy[0][1]:.3f}" if accuracy else "-"
    end = f"{accuracy[-1][1]:.3f}" if accuracy else "-"
    best = f"{max(a for _, a in accuracy):.3f}" if accuracy else "-"
    rise = f"{outcome.rise:+.3f}" if outcome.rise is not None else "-"
    warm = f"{outcome.warm_start_s:.0f}" if outcome.warm_start_s is not None else "-"
    verdict = outcome.failure(min_rise) or "learns"
    return (
        f"{outcome.demo:<5} {outcome.run:>3}  {start:>6} {end:>6} {best:>6} {rise:>7}  {warm:>6} "
        f"{outcome.wall_s:>7.0f}  {outcome.load:<15} {verdict}"
    )


HEADER = "demo  run   start    end   best    rise  warm s  wall s  load (1/5/15)   verdict"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="fresh-clone runs of each demo (3)")
    parser.add_argument("--demos", default="math,calc,lora", help=f"which, comma-separated, of {', '.join(DEMOS)}")
    parser.add_argument("--min-rise", type=float, default=0.15, help="the held-out rise every run must reach (0.15)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/agl-demo-check"), help="where the clones go")
    args = parser.parse_args(argv)
    demos = [d.strip() for d in args.demos.split(",") if d.strip()]
    unknown = [d for d in demos if d not in DEMOS]
    if unknown or args.runs < 1:
        parser.error(f"--demos: unknown {unknown}" if unknown else "--runs: at least 1")
    missing = [venv for venv in VENVS if not (CHECKOUT / venv).is_dir()]
    if missing:
        parser.error(f"{', '.join(missing)} missing in {CHECKOUT}: run `make install-dev engine-venv` first")
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=CHECKOUT,
                           capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    if dirty:
        print("note: uncommitted changes are not in the clones (they check HEAD)", file=sys.stderr)
    args.workdir.mkdir(parents=True, exist_ok=True)
    log_dir = args.workdir / "logs"
    log_dir.mkdir(exist_ok=True)
    print(HEADER, flush=True)
    outcomes = []
    try:
        for run in range(1, args.runs + 1):
            for demo in demos:  # interleaved: a regression in any demo shows in the first round
                outcomes.append(run_one(demo, run, args.workdir, log_dir))
                print(row(outcomes[-1], args.min_rise), flush=True)
    except KeyboardInterrupt:
        print("demo-check: interrupted", file=sys.stderr)
        return 130
    failed = [o for o in outcomes if o.failure(args.min_rise)]
    print(f"{len(outcomes) - len(failed)} of {len(outcomes)} runs learned (logs: {log_dir})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
