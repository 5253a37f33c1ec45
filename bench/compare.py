"""Compare benchmark runs of two checkouts, with the noise of repeated runs of the first.

Usage: ``python bench/compare.py OUT.md BEFORE1.json BEFORE2.json AFTER.json [AFTER2.json]``

Each JSON is a ``cli_overhead.json`` or ``lifecycle.json`` written by the script of that
name (all of one kind). For each row the table gives the before runs' medians, their
spread (the noise: how far two runs of the same code differ), the after runs' medians,
and the verdict: ``worse`` only when the after median is beyond the before runs' range
by more than their spread (at least 5%).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _medians(path: str) -> dict[str, float]:
    data = json.loads(Path(path).read_text())
    if "rows" in data:  # cli_overhead
        return {
            row["name"]: row["stats_ms"]["median"]
            for row in data["rows"]
            if row.get("stats_ms") and row["kind"] != "reference"
        }
    return {name: stats["median"] for name, stats in data["stats"].items()}


def compare(before: list[str], after: list[str]) -> list[str]:
    b = [_medians(p) for p in before]
    a = [_medians(p) for p in after]
    names = [n for n in b[0] if all(n in x for x in (*b, *a))]
    lines = [
        "| row | before (runs) | noise | after (runs) | verdict |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    for name in names:
        olds = [x[name] for x in b]
        news = [x[name] for x in a]
        noise = max(olds) - min(olds)
        higher_is_better = "MB/s" in name or name.endswith("stdout")  # bare_stdout too
        if higher_is_better:
            worse = max(news) < min(olds) - max(noise, 0.05 * min(olds))
        else:
            worse = min(news) > max(olds) + max(noise, 0.05 * max(olds))
        fmt = ", ".join
        lines.append(
            f"| {name} | {fmt(f'{v:.1f}' for v in olds)} | {noise:.1f} | "
            f"{fmt(f'{v:.1f}' for v in news)} | {'WORSE' if worse else 'within noise or better'} |"
        )
    return lines


def main(argv: list[str]) -> int:
    out, *runs = argv
    if len(runs) < 3:
        sys.stderr.write(__doc__ or "")
        return 2
    before, after = runs[:2], runs[2:]
    lines = [
        f"# {Path(before[0]).stem}: before and after",
        "",
        f"before: {', '.join(before)}; after: {', '.join(after)}",
        "",
        *compare(before, after),
        "",
        "A row is WORSE only when every after run is beyond the before runs' range by more "
        "than their spread (at least 5%): two runs of the same code show the noise.",
    ]
    Path(out).write_text("\n".join(lines) + "\n")
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
