"""The CI profile: one short phase per kind of fault, each run on the fenced and the control fleet at once.

Each phase runs its nemeses for ``duration`` seconds while tasks arrive at
``rate`` per second per side, on four accounts (so executions of one account
overlap often), then heals and drains. tests/reliability/test_scenarios.py
runs them all in one world and asserts, per phase: the fenced side has no
violation at all and applied every task exactly once; the control side shows
violations (else the phase tests nothing); faults were injected and proven.
"""

from __future__ import annotations

from .world import PhaseSpec

__all__ = ["CI_PHASES", "ci_phase"]

DURATION = 12.0
RATE = 2.5

CI_PHASES: tuple[PhaseSpec, ...] = (
    PhaseSpec("pause-past-session", ("pause-past-session",), DURATION, RATE),
    PhaseSpec("pause-claim-write", ("pause-claim-write",), DURATION, RATE),
    PhaseSpec("kill-around-commit", ("kill",), DURATION, RATE),
    PhaseSpec("zk-leader", ("zk-leader",), DURATION, RATE),
    PhaseSpec("zk-partition", ("zk-cut",), DURATION + 4, RATE),
    PhaseSpec("redis-restart-aof", ("redis-kill",), DURATION, RATE, store="aof"),
    PhaseSpec("redis-restart-volatile", ("volatile",), DURATION, RATE, store="volatile"),
    PhaseSpec("pg-restart", ("pg-restart",), DURATION, RATE),
    PhaseSpec("clock-jump", ("clock-jump",), DURATION, RATE),
)


def ci_phase(name: str) -> PhaseSpec:
    return next(spec for spec in CI_PHASES if spec.name == name)
