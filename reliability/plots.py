"""The soak's chart: per-side task latency and throughput over time, fault intervals by kind, violations.

::

    python -m reliability.plots OUT      # redraw OUT/soak.png from OUT/timeline.json

The soak writes ``timeline.json`` (:class:`reliability.timeline.Timeline`) next to
its report and draws ``soak.png`` from it. Four panels share the time axis
(seconds since the first task was submitted): task latency (submitted to first
result, log scale), tasks applied per second, one lane per fault kind with each
fault's interval, and one lane per side with each violation at the write that
committed it. The fault intervals are also shaded, by kind, behind the first two
panels.

matplotlib is an optional extra (``pip install 'celery-fencing[plots]'``), imported
only when drawing: :func:`draw_soak` raises :class:`ImportError` with a one-line
message without it. The figure uses matplotlib's object API (no pyplot, no GUI
backend, no global state).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .timeline import Timeline

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = ["MISSING", "draw_soak", "main"]

MISSING = "matplotlib is not installed: pip install 'celery-fencing[plots]' to draw the chart"
SIDE_COLOURS = {"fenced": "#00897b", "control": "#e65100"}
RULE_MARKERS = {
    "stale_accepted": ("X", "stale write accepted"),
    "lost_updates": ("v", "lost update"),
    "duplicate_effects": ("D", "duplicate effect"),
    "non_monotonic": ("^", "non-increasing token"),
}
VIOLATION = "#c62828"
MIN_FAULT_WIDTH = 0.5  # seconds: a kill lasts a millisecond, and must still show
BIN_WIDTHS = (1, 2, 5, 10, 15, 20, 30, 60)  # seconds: the throughput bins, some 50 over the run


def draw_soak(timeline: Timeline, path: Path) -> Path:
    """Draw *timeline* into the PNG *path* and return it; :class:`ImportError` (:data:`MISSING`) without matplotlib."""
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError(MISSING) from exc
    kinds = sorted({fault.kind for fault in timeline.faults})
    colours = _kind_colours(kinds)
    figure = Figure(figsize=(13, 10), dpi=100, layout="constrained")
    latency, rate, lanes, marks = figure.subplots(
        4, 1, sharex=True, gridspec_kw={"height_ratios": [3, 2, max(1.2, 0.28 * len(kinds)), 0.9]}
    )
    for axes in (latency, rate):
        _shade_faults(axes, timeline, colours)
    _latency(latency, timeline)
    _throughput(rate, timeline)
    _fault_lanes(lanes, timeline, kinds, colours)
    _violation_lanes(marks, timeline)
    healed = timeline.faults_until - timeline.origin
    for axes in (latency, rate, lanes, marks):
        axes.axvline(healed, color="#424242", linestyle="--", linewidth=1, zorder=1)
        axes.grid(axis="x", alpha=0.3)
    marks.set_xlim(0, (timeline.ended - timeline.origin) * 1.01)
    marks.set_xlabel("seconds since the first task was submitted")
    figure.suptitle(timeline.title, fontsize=12)
    figure.legend(handles=_legend(timeline), loc="outside lower center", ncols=4, fontsize=9, frameon=False)
    figure.savefig(path)
    return path


def _legend(timeline: Timeline) -> list[Any]:
    """One legend for the figure: the sides (both data panels), the violation markers, the end of the faults."""
    from matplotlib.lines import Line2D

    handles: list[Any] = []
    for side in timeline.sides:
        never = sum(1 for _, _, done in side.tasks if done is None)
        label = f"{side.side}: {len(side.tasks)} tasks" + (f", {never} without a result" if never else "")
        handles.append(Line2D([], [], color=SIDE_COLOURS.get(side.side), marker="o", linewidth=2, label=label))
    for marker, label in RULE_MARKERS.values():
        handles.append(Line2D([], [], color=VIOLATION, marker=marker, linestyle="", label=label))
    handles.append(Line2D([], [], color="#424242", linestyle="--", linewidth=1, label="faults end: heal, drain"))
    return handles


def _kind_colours(kinds: list[str]) -> dict[str, Any]:
    from matplotlib import colormaps

    palette = colormaps["tab20"]
    return {kind: palette(i % 20) for i, kind in enumerate(kinds)}


def _shade_faults(axes: Axes, timeline: Timeline, colours: dict[str, Any]) -> None:
    for fault in timeline.faults:
        start = fault.start - timeline.origin
        end = max(fault.end - timeline.origin, start + MIN_FAULT_WIDTH)
        axes.axvspan(start, end, color=colours[fault.kind], alpha=0.12, linewidth=0, zorder=0)


def _latency(axes: Axes, timeline: Timeline) -> None:
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    for side in timeline.sides:
        points = [(s - timeline.origin, max(d - s, 1e-3)) for s, _, d in side.tasks if d is not None]
        xs, ys = [x for x, _ in points], [y for _, y in points]
        axes.scatter(xs, ys, s=9, alpha=0.55, color=SIDE_COLOURS.get(side.side), linewidths=0, zorder=2)
    axes.set_yscale("log")
    axes.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axes.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
    axes.yaxis.set_minor_formatter(NullFormatter())
    axes.set_ylabel("task latency, s, log scale\n(submitted to first result)")


def _throughput(axes: Axes, timeline: Timeline) -> None:
    end = timeline.ended - timeline.origin
    width = next((w for w in BIN_WIDTHS if w >= end / 50), BIN_WIDTHS[-1])
    bins = int(end // width) + 1
    edges = [i * width for i in range(bins + 1)]
    for side, style in zip(timeline.sides, ("-", "--"), strict=False):
        counts = Counter(int((a - timeline.origin) // width) for _, a, _ in side.tasks if a is not None)
        rates = [counts.get(i, 0) / width for i in range(bins)]
        axes.stairs(rates, edges, color=SIDE_COLOURS.get(side.side), linestyle=style, linewidth=1.6, zorder=2)
    axes.set_ylabel(f"tasks applied/s\n({width:g} s bins)")
    axes.set_ylim(bottom=0)


def _fault_lanes(axes: Axes, timeline: Timeline, kinds: list[str], colours: dict[str, Any]) -> None:
    for row, kind in enumerate(kinds):
        spans = [
            (fault.start - timeline.origin, max(fault.end - fault.start, MIN_FAULT_WIDTH))
            for fault in timeline.faults
            if fault.kind == kind
        ]
        axes.broken_barh(spans, (row - 0.35, 0.7), color=colours[kind])
    # A process fault is one record per side, at the same moment; a server fault one record for both.
    first = timeline.sides[0].side if timeline.sides else "both"
    per_side = Counter(f.kind for f in timeline.faults if f.side in (first, "both"))
    axes.set_yticks(range(len(kinds)), [f"{kind} ({per_side[kind]})" for kind in kinds], fontsize=8)
    axes.set_ylim(len(kinds) - 0.5, -0.5)
    axes.set_ylabel("faults\n(count per side)")


def _violation_lanes(axes: Axes, timeline: Timeline) -> None:
    totals = []
    for row, side in enumerate(timeline.sides):
        for rule, (marker, _) in RULE_MARKERS.items():
            xs = [m.t - timeline.origin for m in side.marks if m.rule == rule]
            axes.scatter(xs, [row] * len(xs), marker=marker, s=36, color=VIOLATION, alpha=0.7, zorder=3)
        counts = ", ".join(f"{rule} {n}" for rule, n in side.violations.items())
        totals.append(f"{side.side} {sum(side.violations.values())}" + (f" ({counts})" if counts else ""))
    axes.set_title("safety violations (the checker's final counts):\n" + "\n".join(totals), loc="left", fontsize=8)
    axes.set_yticks(range(len(timeline.sides)), [side.side for side in timeline.sides])
    axes.set_ylim(len(timeline.sides) - 0.5, -0.5)
    axes.set_ylabel("violations\n(at the write)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reliability.plots", description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the soak's --out directory (reads timeline.json, writes soak.png)")
    args = parser.parse_args(argv)
    timeline = Timeline.from_json(json.loads((args.out / "timeline.json").read_text()))
    try:
        print(draw_soak(timeline, args.out / "soak.png"))
    except ImportError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
