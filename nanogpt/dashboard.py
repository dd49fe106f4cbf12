"""Entry point: `python -m nanogpt.dashboard SWEEP_DIR [--project P] [--entity E] [--group G]`.

Publishes a sweep's W&B view (publish/wandb_view.py) from SWEEP_DIR/wandb_view.json, the file a
multirun with W&B writes at its end: run it once the runs are synced (`wandb sync ...`), with an
API key and wandb-workspaces (`pip install -e '.[dashboard]'`). Without the file, or given
--project, --entity or --group, it (re)writes the file from the sweep's records first.
Exit 0: published; 1: not published (one warning line says why, the file stays); 2: bad input;
74: the view file cannot be written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from nanogpt import logs
from nanogpt.analysis.store import RESULT_FILE
from nanogpt.config.spec import LoggerConfig
from nanogpt.publish.wandb_view import VIEW_FILE, publish, write_view
from nanogpt.record.faults import IO_EXIT


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nanogpt.dashboard", description=__doc__)
    parser.add_argument("sweep_dir", type=Path, help="a sweep dir, e.g. multirun/DATE/TIME")
    parser.add_argument("--project", help=f"W&B project (default {LoggerConfig.project})")
    parser.add_argument("--entity", help="W&B entity (default: your default entity)")
    parser.add_argument("--group", help="W&B group of the sweep's runs (default: DATE/TIME)")
    args = parser.parse_args(argv)
    logs.console()
    sweep_dir: Path = args.sweep_dir
    if not sweep_dir.is_dir():
        return _bad_input(
            f"{sweep_dir} is not a directory; give a sweep dir such as multirun/DATE/TIME"
        )
    rewrite = args.project or args.entity or args.group
    if rewrite or not (sweep_dir / VIEW_FILE).is_file():
        if not any(sweep_dir.rglob(RESULT_FILE)):
            return _bad_input(
                f"{sweep_dir} has no {VIEW_FILE} and no {RESULT_FILE} to write "
                "one from; give a sweep dir such as multirun/DATE/TIME"
            )
        project = args.project or LoggerConfig.project
        try:
            path = write_view(sweep_dir, project, args.entity, args.group)
        except OSError as err:
            print(f"error: {err.filename}: {err.strerror or err}.", file=sys.stderr)
            return IO_EXIT
        print(f"W&B view: written to {path}")
    return 0 if publish(sweep_dir) else 1


def _bad_input(message: str) -> int:
    print(f"error: sweep_dir: {message}.", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
