"""Where a test run's time went, from the lines tests/support/test_times.py appends (AGL_TEST_TIMES).

    python tools/test_times.py data/ci/test-times.tsv [--top 20]

Prints the total, the seconds per test folder and the slowest files and tests (setup, call and teardown summed),
short enough to read at the end of a CI log, even one stopped at its time limit.
"""

from __future__ import annotations

import argparse
import collections
import sys
from collections.abc import Callable
from pathlib import Path


def read_times(path: Path) -> dict[str, float]:
    """Seconds per test node id, its phases summed; lines cut off by a stop are passed over."""
    per_test: dict[str, float] = collections.defaultdict(float)
    for line in path.read_text(encoding="utf-8").splitlines():
        parts = line.split("\t")
        if len(parts) != 3:
            continue
        try:
            per_test[parts[2]] += float(parts[0])
        except ValueError:
            continue
    return per_test


def summed_by(per_test: dict[str, float], key: Callable[[str], str]) -> list[tuple[str, float, int]]:
    seconds: dict[str, float] = collections.defaultdict(float)
    counts: collections.Counter[str] = collections.Counter()
    for node, spent in per_test.items():
        seconds[key(node)] += spent
        counts[key(node)] += 1
    return sorted(((name, seconds[name], counts[name]) for name in seconds), key=lambda row: -row[1])


def folder(node: str) -> str:
    parts = node.split("::")[0].split("/")
    return "/".join(parts[:2]) if len(parts) > 2 else parts[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("times", type=Path, help="the file AGL_TEST_TIMES named")
    parser.add_argument("--top", type=int, default=20, help="how many of the slowest files and tests to list")
    args = parser.parse_args(argv)
    if not args.times.exists():
        print(f"no test times: {args.times} does not exist", file=sys.stderr)
        return 1
    per_test = read_times(args.times)
    total = sum(per_test.values())
    print(f"== test times: {len(per_test)} tests, {total:.0f} s in tests (setup + call + teardown)")
    print("-- per folder")
    for name, spent, count in summed_by(per_test, folder):
        print(f"{spent:8.0f} s {count:5d} tests  {name}")
    print(f"-- the {args.top} slowest files")
    for name, spent, count in summed_by(per_test, lambda node: node.split("::")[0])[: args.top]:
        print(f"{spent:8.0f} s {count:5d} tests  {name}")
    print(f"-- the {args.top} slowest tests")
    for name, spent, _ in sorted(((n, s, 1) for n, s in per_test.items()), key=lambda row: -row[1])[: args.top]:
        print(f"{spent:8.0f} s  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
