"""The pieces of every table: one figure summarised over the repetitions, its cell, the best peer's figure and
tidal's ratio to it, a target met or missed, and the table itself, printed as text or Markdown."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from peers import TIDAL


def _values(runs: list[dict[str, Any]], key: str) -> list[float]:
    return [float(r[key]) for r in runs if "error" not in r and isinstance(r.get(key), (int, float))]


def summary(runs: list[dict[str, Any]] | None, key: str) -> dict[str, Any]:
    """Median, min and max of one figure over the repetitions; the last error where none succeeded."""
    runs = runs or []
    vals = [v for v in _values(runs, key) if not math.isnan(v)]
    if not vals:
        errors = [r["error"] for r in runs if "error" in r]
        return {"error": errors[-1] if errors else "not run"}
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def _fmt(x: float, unit: str) -> str:
    if unit == "rate":  # three significant digits: 1.23M, 45.6k, 789
        for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k"), (1, "")):
            if abs(x) >= div or div == 1:
                v = x / div
                return f"{v:.{2 if abs(v) < 10 else 1 if abs(v) < 100 else 0}f}{suffix}"
    return f"{x:.2f}"


def cell(s: dict[str, Any], unit: str) -> str:
    """``median (min-max)``, or the error."""
    if "error" in s:
        return s["error"]
    if s["n"] == 1 or s["min"] == s["max"]:
        return _fmt(s["median"], unit)
    return f"{_fmt(s['median'], unit)} ({_fmt(s['min'], unit)}-{_fmt(s['max'], unit)})"


def med(s: dict[str, Any]) -> float | None:
    return s.get("median")


def best(values: dict[str, float | None], lower: bool) -> tuple[str, float] | None:
    """The best peer's figure: the highest rate, or the lowest time or memory."""
    ok = {k: v for k, v in values.items() if v is not None and k not in TIDAL}
    if not ok:
        return None
    k = (min if lower else max)(ok, key=lambda n: ok[n])
    return k, ok[k]


def ratio_rows(figures: list[dict[str, float | None]], lower: bool, loaders: list[str]) -> list[list[str]]:
    """Rows "tidal-X ÷ best peer", one per tidal loader, one cell per column of ``figures``."""
    rows = []
    for t in (x for x in TIDAL if x in loaders):
        cells = []
        for col in figures:
            b, mine = best(col, lower), col.get(t)
            cells.append(f"{mine / b[1]:.2f}x ({b[0]})" if b and mine is not None and b[1] else "-")
        rows.append([f"{t} ÷ best peer", *cells])
    return rows


@dataclass
class Target:
    workload: str
    what: str
    figure: str
    met: bool | None

    def verdict(self) -> str:
        return "-" if self.met is None else ("met" if self.met else "missed")

    def line(self) -> str:
        return f"{self.verdict():>6}  {self.what}: {self.figure}"


@dataclass
class Table:
    title: str
    headers: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)  # printed under the table, beside its ratios

    def __post_init__(self) -> None:
        self.rows = [r + [""] * (len(self.headers) - len(r)) for r in self.rows]

    def text(self) -> str:
        widths = [
            max(len(h), *(len(r[i]) for r in self.rows)) if self.rows else len(h) for i, h in enumerate(self.headers)
        ]

        def line(cells: list[str]) -> str:
            return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

        out = [f"\n== {self.title} ==", line(self.headers), "  ".join("-" * w for w in widths)]
        out += [line(r) for r in self.rows] + [f"   {n}" for n in self.notes]
        return "\n".join(out + (["   targets:"] + [f"   {t.line()}" for t in self.targets] if self.targets else []))

    def markdown(self) -> str:
        out = [f"### {self.title}", "", "| " + " | ".join(self.headers) + " |", "|" + "---|" * len(self.headers)]
        out += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in self.rows]
        out += ["", *self.notes] if self.notes else []
        return "\n".join(
            out + (["", "Targets:", ""] + [f"- {t.line().strip()}" for t in self.targets] if self.targets else [])
        )


def check(workload: str, what: str, mine: float | None, bound: float | None, lower: bool, unit: str) -> Target:
    """``mine`` against ``bound``: at most (``lower``) or at least; unknown where either is missing."""
    if mine is None or bound is None:
        return Target(workload, what, "a figure it needs failed or was not measured", None)
    met = mine <= bound if lower else mine >= bound
    return Target(workload, what, f"{_fmt(mine, unit)} (needs {'<=' if lower else '>='} {_fmt(bound, unit)})", met)


def tally(targets: list[Target]) -> str:
    """One line: how many targets were met, missed, or could not be judged."""
    n = {v: sum(t.verdict() == v for t in targets) for v in ("met", "missed", "-")}
    return f"targets: {n['met']} met, {n['missed']} missed, {n['-']} not judged (a figure they need failed or was not measured)"
