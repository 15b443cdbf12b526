"""Where a worker's CPU per task goes: py-spy samples of its processes, turned into microseconds per task.

Used by ``python -m benchmarks.celery_e2e --profile VARIANT [--profile VARIANT ...]``.
For each profiled variant, :func:`record` attaches one ``py-spy record``
(``--format raw --gil --nonblocking``: only the thread holding the GIL is
sampled, and the process is never paused) to the worker's parent and to
each pool process, runs batches of tasks for the given time, and reads each
process's user and system CPU time from /proc over the same window. A thread
holding the GIL is running Python (or C called from Python without releasing
it), so a function's share of a process's samples times the process's
measured *user* CPU per task estimates that function's cost per task; the
system CPU (socket calls, which release the GIL) is printed beside it. Without
``--gil``, py-spy also samples threads that are runnable but waiting for a
core: on a busy machine that charges every Redis round trip the wait to run
again after its reply (2.7x more samples than CPU time at load average 5).

:func:`report` prints, per variant: the measured CPU per task; the task's
path below Celery's tracer as a call tree in us per task; the fencing
library's cost, each sample charged to the innermost ``celery_fencing`` frame
of its stack (so the redis-py, kazoo or sqlite3 work a function calls counts
as that function's, and nothing counts twice); and, with a ``plain`` profile
beside it, the landmarks of the path (start, body, result write) against
plain's and the functions whose own time differs most.
"""

from __future__ import annotations

import collections
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, cpu_split

PACKAGE = "celery_fencing/"
#: The outermost frame of a pool process's task loop (billiard), and of the worker's parent.
POOL_LOOP = "Worker.workloop"


@dataclass
class Samples:
    """py-spy samples of one group of processes (a worker's parent, or its pool processes), by stack."""

    #: (whether the main thread, frames outermost first) -> samples.
    stacks: collections.Counter[tuple[bool, tuple[str, ...]]] = field(default_factory=collections.Counter)

    @property
    def total(self) -> int:
        return sum(self.stacks.values())

    @property
    def threads(self) -> int:
        """Samples of threads other than the main thread (kazoo's connection thread, ...)."""
        return sum(n for (main, _), n in self.stacks.items() if not main)

    def inclusive(self) -> collections.Counter[str]:
        counts: collections.Counter[str] = collections.Counter()
        for (_, frames), n in self.stacks.items():
            for frame in set(frames):
                counts[frame] += n
        return counts

    def exclusive(self) -> collections.Counter[str]:
        counts: collections.Counter[str] = collections.Counter()
        for (_, frames), n in self.stacks.items():
            counts[frames[-1] if frames else "-"] += n
        return counts

    def fencing(self, *, main: bool | None = None) -> collections.Counter[str]:
        """Each sample charged to the innermost frame in ``celery_fencing/`` of its stack (``-`` without one)."""
        counts: collections.Counter[str] = collections.Counter()
        for (is_main, frames), n in self.stacks.items():
            if main is None or main == is_main:
                counts[next((frame for frame in reversed(frames) if PACKAGE in frame), "-")] += n
        return counts

    def tree(self, root: str, depth: int) -> dict[str, Any]:
        """The call tree below the outermost *root* frame of each stack: frame -> [samples, subtree]."""
        tree: dict[str, Any] = {}
        for (_, frames), n in self.stacks.items():
            if root in frames:
                level = tree
                for frame in frames[frames.index(root) : frames.index(root) + depth + 1]:
                    entry = level.setdefault(frame, [0, {}])
                    entry[0] += n
                    level = entry[1]
        return tree


@dataclass
class Profile:
    """One variant's profile: samples and measured CPU time, of its parent and pool processes."""

    variant: str
    tasks: int
    rate: int
    #: Whether only samples of the thread holding the GIL were taken (then they stand for user CPU time).
    gil: bool
    samples: dict[str, Samples]
    #: Role (``parent``, ``pool``) -> (user, system) CPU seconds over the window, from /proc/PID/stat.
    cpu: dict[str, tuple[float, float]]

    def merge(self, other: Profile) -> Profile:
        """This profile and *other* (the same variant, another window) as one."""
        samples = {}
        for role, mine in self.samples.items():
            samples[role] = Samples(mine.stacks + other.samples[role].stacks)
        cpu = {role: _add(self.cpu[role], other.cpu[role]) for role in self.cpu}
        return Profile(self.variant, self.tasks + other.tasks, self.rate, self.gil, samples, cpu)

    def cpu_us(self, role: str, kind: str = "all") -> float:
        """CPU microseconds per task of *role*: ``user``, ``system`` or ``all``."""
        user, system = self.cpu[role]
        seconds = {"user": user, "system": system, "all": user + system}[kind]
        return seconds / self.tasks * 1e6

    def us(self, role: str, count: int) -> float:
        """Microseconds per task that *count* samples of *role* stand for.

        GIL samples are charged the user CPU time (system calls mostly run with
        the GIL released), other samples all of it.
        """
        total = self.samples[role].total
        return count / total * self.cpu_us(role, "user" if self.gil else "all") if total else 0.0


def _add(a: tuple[Any, Any], b: tuple[Any, Any]) -> tuple[Any, Any]:
    return a[0] + b[0], a[1] + b[1]


def record(
    variant: str,
    parent: int,
    pool: list[int],
    run_batch: Callable[[], int],
    seconds: float,
    out_dir: Path,
    rate: int = 400,
    gil: bool = True,
) -> Profile:
    """Sample the worker's processes while batches run for *seconds*; return the profile.

    *run_batch* sends one batch, waits for its results and returns its number
    of tasks. *gil*: sample only the thread holding the GIL (see the module's
    docstring for why that is the default).
    """
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    out_dir.mkdir(parents=True, exist_ok=True)
    roles = {parent: "parent", **{pid: "pool" for pid in pool}}
    outputs: dict[Path, str] = {}
    spies = []
    for pid, role in roles.items():
        out = out_dir / f"pyspy-{variant}-{role}-{pid}.txt"
        outputs[out] = role
        command = [spy, "record", "--pid", str(pid), "--rate", str(rate), "--duration", str(int(seconds) + 60)]
        command += ["--format", "raw", "--nolineno", "--threads", "--nonblocking", "--output", str(out)]
        command += ["--gil"] if gil else []
        spies.append(subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
    time.sleep(1.0)  # py-spy attaches; the workers are idle meanwhile, and idle threads are not sampled
    for proc in spies:
        if proc.poll() is not None:
            raise RuntimeError(f"py-spy exited: {proc.stderr.read().decode()[-500:] if proc.stderr else ''}")
    before = {pid: cpu_split(pid) for pid in roles}
    tasks = 0
    finish = time.monotonic() + seconds
    while time.monotonic() < finish:
        tasks += run_batch()
    after = {pid: cpu_split(pid) for pid in roles}
    for proc in spies:
        proc.send_signal(signal.SIGINT)  # py-spy writes its output and exits
    for proc in spies:
        proc.wait(60)
    cpu: dict[str, tuple[float, float]] = {"parent": (0.0, 0.0), "pool": (0.0, 0.0)}
    for pid, role in roles.items():
        cpu[role] = _add(cpu[role], (after[pid][0] - before[pid][0], after[pid][1] - before[pid][1]))
    samples = {"parent": Samples(), "pool": Samples()}
    for path, role in outputs.items():
        read_raw(path, samples[role])
    return Profile(variant, tasks, rate, gil, samples, cpu)


def read_raw(path: Path, into: Samples) -> None:
    """Add py-spy's raw (collapsed) output at *path* to *into*; frames are ``function (file)``."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return
    for line in lines:
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        frames = [frame for frame in stack.split(";") if frame and not frame.startswith("process ")]
        # "thread (tid): name" first (its name once py-spy knows it), then the frames, outermost first.
        main = "MainThread" in frames[0] or "_run_module_as_main" in stack if frames else False
        frames = [_short(frame) for frame in frames if not frame.startswith("thread ")]
        into.stacks[main, tuple(frames)] += int(count_text)


def _short(frame: str) -> str:
    return frame.replace(str(ROOT) + "/", "").split("/site-packages/")[-1]


#: Landmarks of the task's path in a pool process, compared with plain's (label, frame).
LANDMARKS = (
    ("the whole execution (Celery's tracer)", "build_tracer.<locals>.trace_task (celery/app/trace.py)"),
    ("FencedTask.before_start: arm, mint, claim", "FencedTask.before_start (celery_fencing/celery/task.py)"),
    ("the task's __call__ around the body", "FencedTask.__call__ (celery_fencing/celery/task.py)"),
    ("the body (its one write)", "make_app.<locals>.work (benchmarks/celery_app.py)"),
    ("the result write (store_result)", "Backend.store_result (celery/backends/base.py)"),
    ("signals sent (Signal.send)", "Signal.send (celery/utils/dispatch/signal.py)"),
    ("the pool's loop, all of it", "Worker.workloop (billiard/pool.py)"),
)


def report(profiles: Iterable[Profile], top: int = 25, depth: int = 3, least: float = 0.005) -> str:
    """The profiles as text: measured CPU, the task's path, the fencing library's cost by function, plain's.

    *depth* levels of the call tree below Celery's tracer are shown, without
    the nodes under *least* of the pool's samples.
    """
    profiles = list(profiles)
    plain = next((p for p in profiles if p.variant == "plain"), None)
    lines: list[str] = []
    for profile in profiles:
        pool = profile.samples["pool"]
        charged = profile.cpu["pool"][0] if profile.gil else sum(profile.cpu["pool"])
        covered = pool.total / profile.rate / max(1e-9, charged)
        lines.append(f"== py-spy, {profile.variant}: {profile.tasks} tasks; measured per task:")
        for role in ("pool", "parent"):
            lines.append(
                f"   {role:6} CPU {profile.cpu_us(role):6.0f} us (user {profile.cpu_us(role, 'user'):5.0f}, "
                f"system {profile.cpu_us(role, 'system'):5.0f}); {profile.samples[role].total} samples"
            )
        kind = "samples of the thread holding the GIL, charged the user CPU" if profile.gil else "samples, all the CPU"
        lines.append(
            f"   pool: {kind}, at {profile.rate} Hz (samples / rate / CPU charged: {covered:.2f}); "
            f"threads other than the main one: {100 * pool.threads / max(1, pool.total):.1f}% of the samples"
        )
        lines.append("-- the task's path in the pool processes, us per task (callees included):")
        lines += _tree(profile, pool.tree(LANDMARKS[0][1], depth), least * pool.total, 0)
        if pool.threads:
            lines.append("-- threads other than the main one, us per task (callees included):")
            other = Samples(collections.Counter({key: n for key, n in pool.stacks.items() if not key[0]}))
            roots = collections.Counter(frames[min(3, len(frames) - 1)] for (_, frames) in other.stacks if frames)
            for root, _ in roots.most_common(2):
                lines += _tree(profile, other.tree(root, depth), least * pool.total, 0)
        fencing = {name: n for name, n in pool.fencing().items() if name != "-"}
        if fencing:
            lines.append(
                f"-- celery_fencing, {profile.us('pool', sum(fencing.values())):.0f} us per task in all: each sample "
                "charged to the innermost celery_fencing frame of its stack (the redis-py, kazoo, sqlite3 it calls "
                "included); us/task, % of the pool's samples:"
            )
            for name, count in collections.Counter(fencing).most_common(top):
                lines.append(f"{profile.us('pool', count):8.1f} {100 * count / pool.total:6.1f}%  {name}")
        if plain is not None and profile is not plain:
            lines += _against_plain(profile, plain)
    return "\n".join(lines)


def _tree(profile: Profile, tree: dict[str, Any], least: float, indent: int) -> list[str]:
    lines = []
    for frame, (count, children) in sorted(tree.items(), key=lambda item: -item[1][0]):
        if count >= least:
            lines.append(f"{profile.us('pool', count):8.1f} {' ' * indent}{frame}")
            lines += _tree(profile, children, least, indent + 2)
    return lines


def _against_plain(profile: Profile, plain: Profile, top: int = 10) -> list[str]:
    """The landmarks of the task's path beside plain's; the functions whose own time differs most."""
    lines = [
        f"-- against plain, us per task (measured: pool {profile.cpu_us('pool') - plain.cpu_us('pool'):+.0f}, "
        f"user {profile.cpu_us('pool', 'user') - plain.cpu_us('pool', 'user'):+.0f}; parent "
        f"{profile.cpu_us('parent') - plain.cpu_us('parent'):+.0f}); inclusive:",
        f"{profile.variant:>14} {'plain':>8} {'delta':>8}  part of the task's path",
    ]
    mine, theirs = profile.samples["pool"].inclusive(), plain.samples["pool"].inclusive()
    for label, frame in LANDMARKS:
        a, b = profile.us("pool", mine[frame]), plain.us("pool", theirs[frame])
        lines.append(f"{a:14.1f} {b:8.1f} {a - b:+8.1f}  {label}")
    for role in ("pool", "parent"):
        mine, theirs = profile.samples[role].exclusive(), plain.samples[role].exclusive()
        deltas = sorted(
            ((profile.us(role, mine[name]) - plain.us(role, theirs[name]), name) for name in {*mine, *theirs}),
            key=lambda item: -abs(item[0]),
        )
        lines.append(f"{role}, own time (callees excluded), the {top} largest differences: delta  function")
        lines += [f"{delta:+8.1f}  {name}" for delta, name in deltas[:top]]
    return lines


def summary(profile: Profile) -> dict[str, Any]:
    """The profile's figures as plain data (for tests and for saving beside the raw files)."""
    return {
        "variant": profile.variant,
        "tasks": profile.tasks,
        "cpu_us": {role: profile.cpu_us(role) for role in profile.cpu},
        "user_us": {role: profile.cpu_us(role, "user") for role in profile.cpu},
        "fencing_us": {name: profile.us("pool", n) for name, n in profile.samples["pool"].fencing().items()},
    }
