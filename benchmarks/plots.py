"""Bar charts of the Celery end-to-end benchmark: tasks/s and worker CPU per task by variant, floors drawn.

matplotlib is an optional extra (``pip install 'celery-fencing[plots]'``), imported
only when a chart is drawn: :func:`draw_celery` raises :class:`ImportError` with a
one-line message when it is missing. The figures are built with matplotlib's
object API (no pyplot, so no GUI backend and no global state).
"""

from __future__ import annotations

import statistics
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.celery_e2e import FLOORS, TARGETS, VARIANTS, EndToEnd

if TYPE_CHECKING:
    from matplotlib.axes import Axes

MISSING = "matplotlib is not installed: pip install 'celery-fencing[plots]' to draw the charts"
#: Bar colours by family: the baselines grey, token mode and exclusive mode in the docs' teal.
COLOURS = {"plain": "#9e9e9e", "singleton": "#7e57c2", "fenced": "#00897b", "exclusive": "#004d40"}
FLOOR_STYLES = {"floor-zk-write": "--", "floor-serial": (0, (1, 1))}


def new_figure(**kwargs: Any) -> Any:
    """A matplotlib ``Figure`` (constrained layout); :class:`ImportError` with :data:`MISSING` without matplotlib."""
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError(MISSING) from exc
    return Figure(layout="constrained", **kwargs)


def draw_celery(result: EndToEnd, out: Path) -> list[Path]:
    """Write ``celery-tasks-per-second.png`` and ``celery-worker-cpu-per-task.png`` into *out*; return their paths.

    Each bar is a variant's median over the rounds, its whisker the rounds'
    min-max; the floor variants are drawn as dashed lines across the bars, and
    each throughput target (a fraction of plain) as a red mark on its bar.
    """
    out.mkdir(parents=True, exist_ok=True)
    rounds = max(len(values) for values in result.rates.values())
    worker_cpu = {key: roles["worker"] for key, roles in result.cpu.items() if roles.get("worker")}
    charts = [
        (
            "celery-tasks-per-second.png",
            result.rates,
            "tasks/s (higher is better)",
            "Celery end to end: throughput",
            "tasks/s",
        ),
        (
            "celery-worker-cpu-per-task.png",
            worker_cpu,
            "worker CPU per task, µs (lower is better)",
            "Celery end to end: worker CPU per task (main and pool processes)",
            "µs",
        ),
    ]
    paths = []
    for name, samples, ylabel, title, unit in charts:
        figure = new_figure(figsize=(10, 5.8), dpi=110)
        axes = figure.add_subplot()
        _bars(axes, samples, unit, with_targets=name == "celery-tasks-per-second.png")
        figure.legend(loc="outside lower center", fontsize=8.5, frameon=False)
        axes.set_ylabel(ylabel)
        axes.set_title(f"{title}\nbars: median of {rounds} round(s), whiskers: min-max", fontsize=11)
        path = out / name
        figure.savefig(path)
        paths.append(path)
    return paths


def _bars(axes: Axes, samples: dict[str, list[float]], unit: str, *, with_targets: bool) -> None:
    floors = set(FLOORS.values())
    keys = [key for key in VARIANTS if key in samples and key not in floors]
    medians = [statistics.median(samples[key]) for key in keys]
    low = [statistics.median(samples[key]) - min(samples[key]) for key in keys]
    high = [max(samples[key]) - statistics.median(samples[key]) for key in keys]
    colours = [COLOURS.get(key, COLOURS[VARIANTS[key].variant]) for key in keys]
    positions = range(len(keys))
    bars = axes.bar(positions, medians, yerr=[low, high], capsize=4, color=colours, width=0.6, zorder=2)
    labels = axes.bar_label(bars, labels=[f"{m:,.0f}" for m in medians], padding=3, fontsize=9, zorder=5)
    for label in labels:  # readable where a floor or target line passes behind it
        label.set_bbox({"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1})
    ticks = [f"{key}\n{textwrap.fill(VARIANTS[key].label, 22)}" for key in keys]
    axes.set_xticks(list(positions), ticks, fontsize=8)
    axes.grid(axis="y", alpha=0.3, zorder=0)
    axes.margins(y=0.12)
    # Each floor is drawn across the bar of the variant it bounds, not across the chart.
    for key, floor in FLOORS.items():
        if key in keys and floor in samples:
            x, value = keys.index(key), statistics.median(samples[floor])
            label = f"{VARIANTS[floor].label} (for {key}): {value:,.0f} {unit}"
            axes.hlines(
                value,
                x - 0.45,
                x + 0.45,
                color="#212121",
                linestyle=FLOOR_STYLES[floor],
                linewidth=1.6,
                label=label,
                zorder=4,
            )
    if with_targets and "plain" in samples:
        plain = statistics.median(samples["plain"])
        targets = {key: fraction for key, fraction in TARGETS.items() if key in keys}
        label = "target: " + ", ".join(f"{key} >= {fraction:.2f}x plain" for key, fraction in targets.items())
        for key, fraction in targets.items():
            x = keys.index(key)
            axes.hlines(fraction * plain, x - 0.45, x + 0.45, color="#c62828", linewidth=2.5, label=label, zorder=4)
            label = "_"  # one legend entry for all targets
