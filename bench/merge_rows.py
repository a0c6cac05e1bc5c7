"""Put the rows of a later bench/run.py measurement (its --json) into an earlier one and write the report again,
saying so in the report: ``python bench/merge_rows.py EARLIER.json LATER.json [--out docs/BENCHMARKS.md]``.
Used when a change touches a few rows only (the later run's command and commit are named in the report)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import report  # noqa: E402


def merge(earlier: dict, later: dict, commit: str) -> dict:
    """``earlier`` with every row of ``later`` in place of (or after) its own, and a note naming the later run."""
    models = {m["model"]: m for m in earlier["models"]}
    keys = set()
    for model in later["models"]:
        if model["model"] in models:
            models[model["model"]]["rows"].update(model["rows"])
            keys.update(model["rows"])
    earlier.setdefault("notes", []).append(
        f"Rows {', '.join(sorted(keys))} were measured again at {commit} (`{later['command']}`, "
        f"{later.get('seconds', 0) / 60:.1f} min) and replace this run's.")
    return earlier


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("earlier")
    parser.add_argument("later")
    parser.add_argument("--commit", required=True, help="the commit the later run measured")
    parser.add_argument("--out", default=str(report.REPO / "docs" / "BENCHMARKS.md"))
    args = parser.parse_args()
    merged = merge(json.loads(Path(args.earlier).read_text()), json.loads(Path(args.later).read_text()), args.commit)
    report.write(merged, args.out)


if __name__ == "__main__":
    main()
