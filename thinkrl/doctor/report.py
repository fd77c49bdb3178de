"""The doctor's results as a console table (fits ~120 columns) or JSON."""

from __future__ import annotations

import json
import textwrap

from thinkrl.doctor.core import CheckResult

WIDTHS = (27, 6, 40, 41)
"""Columns: check, status, found, fix; with 3 separators of 2 spaces: 120 columns."""
HEADER = ("check", "status", "found", "fix")


def table(results: list[CheckResult], *, widths: tuple[int, ...] = WIDTHS) -> str:
    """Rows of `results`, long text wrapped inside its column."""
    lines = [_line(HEADER, widths), _line(tuple("-" * w for w in widths), widths)]
    for r in results:
        cells = [textwrap.wrap(text, width, break_long_words=True, break_on_hyphens=False) or [""]
                 for text, width in zip((r.check, r.status, r.found, r.fix), widths)]
        for i in range(max(len(c) for c in cells)):
            lines.append(_line(tuple(c[i] if i < len(c) else "" for c in cells), widths))
    return "\n".join(lines)


def _line(cells: tuple[str, ...], widths: tuple[int, ...]) -> str:
    return "  ".join(f"{cell:<{w}}" for cell, w in zip(cells, widths)).rstrip()


def listing(results: list[CheckResult]) -> str:
    """One unwrapped block per row (paths stay whole, for logs and errors)."""
    blocks = []
    for r in results:
        block = f"  {r.status.upper():<4} {r.check}: {r.found}"
        blocks.append(block + (f"\n       fix: {r.fix}" if r.fix else ""))
    return "\n".join(blocks)


def summary(results: list[CheckResult]) -> str:
    counts = {s: sum(r.status == s for r in results) for s in ("ok", "warn", "fail", "skip")}
    return ", ".join(f"{n} {s}" for s, n in counts.items() if n)


def to_json(results: list[CheckResult]) -> str:
    return json.dumps([r.to_dict() for r in results], indent=2)
