"""Collection throughput: expert episodes per second with faults on, `--workers N` against `--workers 1`.

Usage: python benchmarks/collect_throughput.py [--episodes 2000] [--workers 2] [--faults 0.25]
Prints both figures (same settings, same run) and their ratio. The output files are byte-identical
apart from timing fields, so the comparison is like for like. Target: >= 100 episodes/s on 2 cores.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from agentrig.data.collect import CollectConfig, run_collect
from agentrig.envs import load_env


def measure(episodes: int, workers: int, faults: float, folder: str) -> float:
    """Episodes per second of one whole collection (process start-up and writing included)."""
    cfg = CollectConfig(episodes=episodes, workers=workers, faults=faults, rename=0.2, detours=0.1,
                        out=os.path.join(folder, f"w{workers}.jsonl"))
    start = time.perf_counter()
    run_collect(cfg, progress=False)
    return episodes / (time.perf_counter() - start)


def main() -> None:
    """Run both measurements and print them with the ratio."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--episodes", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--faults", type=float, default=0.25)
    args = parser.parse_args()
    load_env("datadesk")  # generate the database outside the timed part
    with tempfile.TemporaryDirectory() as folder:
        single = measure(args.episodes, 1, args.faults, folder)
        multi = measure(args.episodes, args.workers, args.faults, folder)
    print(f"collect, expert teacher, faults {args.faults}, {args.episodes} episodes, {os.cpu_count()} CPUs")
    print(f"  workers=1 (peer): {single:8.1f} episodes/s")
    print(f"  workers={args.workers}:        {multi:8.1f} episodes/s")
    print(f"  ratio:            {multi / single:8.2f}x")


if __name__ == "__main__":
    main()
