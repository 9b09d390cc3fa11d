"""Data preparation benchmark: python scripts/bench_data.py [--sizes 100 400] [--procs 1 2] [--repeat 3] [--work DIR]

Generates JSONL corpora of the given sizes (MB), prepares each with GPT-2 BPE on 1 and N threads, times
launch to first training step and a single-call encode_ordinary baseline; prints a markdown table of the
median runs and each thread count's speed-up over one thread.
"""

import argparse
import os
from pathlib import Path

from gpt.bench.data import bench, speedups, table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 400], help="corpus sizes in MB")
    parser.add_argument("--procs", type=int, nargs="+", default=sorted({1, os.cpu_count() or 1}),
                        help="data.num_proc values to compare")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each measurement (the median is reported)")
    parser.add_argument("--work", type=Path, default=Path("runs/bench_data"), help="corpora and prepared data")
    args = parser.parse_args()
    if args.repeat < 1 or min(args.sizes) < 1 or min(args.procs) < 1:
        parser.error("--repeat, --sizes and --procs must be positive")
    if max(args.repeat, *args.sizes, *args.procs) >= 2**63:
        parser.error("--repeat, --sizes and --procs must fit in 64 bits")
    rows = bench(args.sizes, args.procs, args.work, args.repeat, log=lambda row: print(row, flush=True))
    print(table(rows))
    print("\n".join(speedups(rows)))


if __name__ == "__main__":
    main()
