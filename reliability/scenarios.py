"""The CI profile: one short phase per kind of fault, each run on the fenced and the control fleet at once.

Each phase runs its nemeses for ``duration`` seconds while tasks arrive in
pairs on one of four accounts (so executions of one account overlap), 2.5 per
second per side, then heals and drains. tests/reliability/test_scenarios.py
runs them all in one world and asserts, per phase: the fenced side has no
violation at all and applied every task exactly once; the control side shows
violations (else the phase tests nothing); faults were injected and proven.
"""

from __future__ import annotations

from .world import PhaseSpec

__all__ = ["CI_PHASES", "ci_phase"]

DURATION = 12.0
# 2.5 tasks per second per side, sent in pairs on one account: the two of a
# pair overlap, so the control loses updates in every phase, whatever the fault.
RATE, BURST = 1.25, 2

CI_PHASES: tuple[PhaseSpec, ...] = (
    PhaseSpec("pause-past-session", ("pause-past-session",), DURATION, RATE, burst=BURST),
    PhaseSpec("pause-claim-write", ("pause-claim-write",), DURATION, RATE, burst=BURST),
    PhaseSpec("kill-around-commit", ("kill",), DURATION, RATE, burst=BURST),
    PhaseSpec("zk-leader", ("zk-leader",), DURATION, RATE, burst=BURST),
    PhaseSpec("zk-partition", ("zk-cut",), DURATION + 4, RATE, burst=BURST),
    PhaseSpec("redis-restart-aof", ("redis-kill",), DURATION, RATE, burst=BURST, store="aof"),
    PhaseSpec("redis-restart-volatile", ("volatile",), DURATION, RATE, burst=BURST, store="volatile"),
    PhaseSpec("pg-restart", ("pg-restart",), DURATION, RATE, burst=BURST),
    PhaseSpec("clock-jump", ("clock-jump",), DURATION, RATE, burst=BURST),
)


def ci_phase(name: str) -> PhaseSpec:
    return next(spec for spec in CI_PHASES if spec.name == name)
