"""Entry point: `python -m nanogpt.report DIR [--baseline TEXT] [--plots]`.

(Re)builds the table of any sweep dir, finished or not: summary.csv and summary.md in DIR,
printed, and the plots with --plots (results/table.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from nanogpt.results.table import ReportError, publish


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nanogpt.report", description=__doc__)
    parser.add_argument("sweep_dir", type=Path, help="a sweep dir, e.g. multirun/DATE/TIME")
    parser.add_argument("--baseline", help="text of the overrides of the speedup baseline row")
    parser.add_argument("--plots", action="store_true", help="also write PNG plots")
    args = parser.parse_args(argv)
    if not args.sweep_dir.is_dir():
        print(
            f"error: sweep_dir: {args.sweep_dir} is not a directory; give a sweep dir "
            "such as multirun/DATE/TIME.",
            file=sys.stderr,
        )
        return 2
    try:
        publish(args.sweep_dir, args.baseline, args.plots)
    except ReportError as err:
        print(f"error: {err}.", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
