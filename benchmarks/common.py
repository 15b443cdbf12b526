"""What every benchmark shares: alternating rounds, medians and ratios, progress lines, peak RSS, the machine."""

from __future__ import annotations

import logging
import math
import os
import platform
import resource
import statistics
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

REDIS_URL = os.environ.get("FENCING_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")

#: Progress lines (one per subject and round, one per worker started, ...): INFO on this logger.
PROGRESS = logging.getLogger("benchmarks")


def show_progress() -> None:
    """Print the progress lines on stderr, stamped with the time; stdout keeps only the tables.

    Plain logging rather than a progress bar: a bar redraws one line in place,
    which a CI log or ``| tee`` turns into noise, and a benchmark's rounds are
    discrete events. Idempotent (each entry point calls it).
    """
    if not PROGRESS.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
        PROGRESS.addHandler(handler)
        PROGRESS.setLevel(logging.INFO)
        PROGRESS.propagate = False


def alternate(
    subjects: dict[str, Callable[[], float]], rounds: int, *, section: str = "", unit: str = ""
) -> dict[str, list[float]]:
    """Call every subject once per round, rotating which goes first; return each subject's samples.

    Drift on a shared machine (other suites, page cache, CPU frequency) then
    hits every subject alike, and each ratio compares samples of the same rounds.
    Each sample is logged as a progress line (``section round i/n: subject value unit``).
    """
    names = list(subjects)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for round_no in range(rounds):
        shift = round_no % len(names)
        for name in names[shift:] + names[:shift]:
            value = subjects[name]()
            samples[name].append(value)
            PROGRESS.info("%s round %d/%d: %s %.1f %s", section, round_no + 1, rounds, name, value, unit)
    return samples


def rate(call: Callable[[], object], count: int, per_call: int = 1) -> float:
    """Run *call* *count* times back to back; return operations per second (``per_call`` operations per call)."""
    started = time.perf_counter()
    for _ in range(count):
        call()
    return count * per_call / (time.perf_counter() - started)


@dataclass
class Table:
    """Printed results: one line per subject (median of its rounds), then one per ratio."""

    title: str
    unit: str
    samples: dict[str, list[float]]
    #: (label, numerator subject, denominator subject, target or None); a ratio of medians.
    ratios: list[tuple[str, str, str, float | None]] = field(default_factory=list)
    #: Whether a larger value is better (throughput: ratios must reach their target)
    #: or worse (latency: ratios must stay at or below it).
    higher_is_better: bool = True

    def meets(self, value: float, target: float) -> bool:
        return value >= target if self.higher_is_better else value <= target

    def median(self, name: str) -> float:
        return statistics.median(self.samples[name])

    def ratio(self, numerator: str, denominator: str) -> float:
        return self.median(numerator) / self.median(denominator)

    def render(self) -> str:
        lines = [f"== {self.title}", f"{'subject':48} {'median ' + self.unit:>16} {'min':>10} {'max':>10} rounds"]
        for name, values in self.samples.items():
            lines.append(
                f"{name:48} {statistics.median(values):16.1f} {min(values):10.1f} {max(values):10.1f} {len(values):6d}"
            )
        for label, numerator, denominator, target in self.ratios:
            value = self.ratio(numerator, denominator)
            sign = ">=" if self.higher_is_better else "<="
            verdict = ""
            if target is not None:
                verdict = f"  target {sign} {target:.2f}x: {'met' if self.meets(value, target) else 'MISSED'}"
            lines.append(f"ratio {label:42} {value:16.3f}{verdict}")
        return "\n".join(lines)

    def missed(self) -> list[str]:
        return [
            label
            for label, numerator, denominator, target in self.ratios
            if target is not None and not self.meets(self.ratio(numerator, denominator), target)
        ]


def percentile(values: list[float], fraction: float) -> float:
    """The nearest-rank percentile of *values* (*fraction* 0.99 for p99): a measured value, never interpolated."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


@dataclass
class LatencyTable:
    """Printed latency results: per subject, the median over the rounds of each round's p50 and p99.

    The ratios are of those medians (p99 first, the one a target is set on;
    p50 beside it); a latency ratio meets its target at or below it.
    """

    title: str
    #: Printed under the title: what is measured, from which clock to which.
    legend: list[str]
    #: Subject -> one (p50, p99) per round, in milliseconds.
    samples: dict[str, list[tuple[float, float]]]
    #: (label, numerator subject, denominator subject, target on the p99 ratio or None).
    ratios: list[tuple[str, str, str, float | None]] = field(default_factory=list)
    #: Subject -> a remark printed at the end of its line (e.g. that it ran over its capacity).
    remarks: dict[str, str] = field(default_factory=dict)
    #: Prefixed to the labels :meth:`missed` returns, to say which table missed.
    name: str = "latency"

    def p50(self, subject: str) -> float:
        return statistics.median(p50 for p50, _ in self.samples[subject])

    def p99(self, subject: str) -> float:
        return statistics.median(p99 for _, p99 in self.samples[subject])

    def render(self) -> str:
        width = max([48, *(len(name) for name in self.samples)])
        lines = [f"== {self.title}"]
        for paragraph in self.legend:
            lines += textwrap.wrap(paragraph, 116, initial_indent="   ", subsequent_indent="   ")
        lines.append(
            f"{'subject':{width}} {'median p50 ms':>14} {'median p99 ms':>14} {'p99 min':>9} {'p99 max':>9} rounds"
        )
        for name, values in self.samples.items():
            p99s = [p99 for _, p99 in values]
            remark = f"  {self.remarks[name]}" if name in self.remarks else ""
            lines.append(
                f"{name:{width}} {self.p50(name):14.2f} {self.p99(name):14.2f} {min(p99s):9.2f} {max(p99s):9.2f} "
                f"{len(values):6d}{remark}"
            )
        for label, numerator, denominator, target in self.ratios:
            p99 = self.p99(numerator) / self.p99(denominator)
            p50 = self.p50(numerator) / self.p50(denominator)
            verdict = f"  target <= {target:.2f}x: {'met' if p99 <= target else 'MISSED'}" if target is not None else ""
            lines.append(f"ratio {label + ', p99':42} {p99:16.3f}  p50 {p50:.3f}{verdict}")
        return "\n".join(lines)

    def missed(self) -> list[str]:
        return [
            f"{self.name}: {label}, p99"
            for label, numerator, denominator, target in self.ratios
            if target is not None and self.p99(numerator) / self.p99(denominator) > target
        ]


def peak_rss_mib(pid: int | None = None) -> float:
    """Peak resident set size in MiB: of *pid* (VmHWM from /proc), or of this process."""
    if pid is None:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return _status_kib(pid, "VmHWM") / 1024


def rss_mib(pid: int) -> float:
    """Current resident set size of *pid* in MiB (VmRSS)."""
    return _status_kib(pid, "VmRSS") / 1024


def _status_kib(pid: int, field_name: str) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return float(line.split()[1])
    except OSError:
        pass
    return float("nan")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time *pid* has used so far, in seconds (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_split(pid: int) -> tuple[float, float]:
    """User and system CPU time *pid* has used so far, in seconds ((0, 0) when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0, 0.0
    ticks = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / ticks, int(fields[12]) / ticks


def pid_of(command_name: str) -> int | None:
    """The pid of a running process whose command name is *command_name* (read-only look at /proc)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == command_name:
                    return int(entry.name)
            except OSError:
                continue
    return None


def machine() -> str:
    """One line naming the machine: CPUs, CPU model, memory, load average, Python."""
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
    except (OSError, ValueError):
        pages = float("nan")
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    return (
        f"{os.cpu_count()} CPU(s) ({model}), {pages:.0f} GiB, load average {load}; "
        f"Python {platform.python_version()} on {platform.system()} {platform.release()}"
    )
