"""The markdown table of ``fedlora evaluate --json`` results (docs/instruction-tuning.md, every held-out
item): per arm, over its seeds, the mean ± std of the held-out accuracy, its gain over the base model
(``fedlora evaluate --base``, scored on the same items), acc_norm, exact match of the generated
answers and the answers' perplexity; then each set's accuracy, base → after, averaged over seeds.

usage: python scripts/evaluation_table.py BASE.json --arm LABEL FILE [FILE ...] [--arm LABEL FILE ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from server.bench.suite.sections import mean_std

COLUMNS = ("accuracy", "acc_norm", "exact_match", "perplexity")


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def table(base: dict, arms: list[tuple[str, list[dict]]]) -> str:
    """The table's markdown: a row for the base model, one per arm, and per-set notes."""
    items = {base["eval_examples"], *(r["eval_examples"] for _, runs in arms for r in runs)}
    if len(items) != 1:
        raise SystemExit(f"the results score different numbers of items: {sorted(items)}")
    head = ["arm", "seeds", "accuracy", "gain over the base", *COLUMNS[1:]]
    b = base["metrics"]
    lines = [_row(head), "|" + "---|" * len(head)]
    lines.append(
        _row(["base model", "–", f"{b['accuracy']:.3f}", "–", *(f"{b[c]:.3f}" for c in COLUMNS[1:])])
    )
    notes = []
    for label, runs in arms:
        m = [r["metrics"] for r in runs]
        gains = mean_std([x["accuracy"] - b["accuracy"] for x in m])
        lines.append(
            _row(
                [
                    label,
                    str(len(runs)),
                    mean_std([x["accuracy"] for x in m]),
                    gains,
                    *(mean_std([x[c] for x in m]) for c in COLUMNS[1:]),
                ]
            )
        )
        sets = sorted(k.split("/", 1)[1] for k in m[0] if k.startswith("accuracy/"))
        per_set = ", ".join(
            f"{s} {b[f'accuracy/{s}']:.2f} → {statistics.mean(x[f'accuracy/{s}'] for x in m):.2f}"
            for s in sets
        )
        notes.append(f"- {label}, accuracy per set (base → after, mean over seeds): {per_set}")
    return "\n".join([*lines, "", *notes]) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base", type=Path, help="fedlora evaluate --base --json output")
    parser.add_argument(
        "--arm", nargs="+", action="append", required=True, metavar="LABEL FILE", help="an arm"
    )
    args = parser.parse_args(argv)
    read = lambda path: json.loads(Path(path).read_text(encoding="utf-8"))  # noqa: E731
    arms = [(label, [read(f) for f in files]) for label, *files in args.arm]
    print(table(read(args.base), arms), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
