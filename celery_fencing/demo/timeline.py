"""The outcome of the two runs as text: each run's timeline table and verdict, the conclusion and its exit code."""

from __future__ import annotations

from typing import Any, TextIO

from .story import EXPECTED, FIRST_DEPOSIT, OPENING_BALANCE, SECOND_DEPOSIT, Row, RunResult
from .tasks import RETRY_COUNTDOWN

__all__ = ["EXIT_FAILED", "EXIT_OK", "conclude", "render_table", "row_of", "verdict"]

EXIT_OK = 0
EXIT_FAILED = 1


def _token(event: dict[str, Any]) -> str:
    value = event.get("token")
    return "-" if value is None else str(value)


def row_of(event: dict[str, Any], start: float) -> Row:
    """The timeline row of one worker *event*, its time counted from *start*."""
    kind = event["kind"]
    t = event["t"] - start
    worker = event.get("worker", "?")
    amount = event.get("amount")
    token = _token(event)
    fenced = event.get("token") is not None
    if kind == "start":
        again = f" again (retry {event['attempt']})" if event.get("attempt") else ""
        if fenced:
            return Row(
                t, worker, f"deposit {amount} starts{again}: mints, claims", token, f"claimed, mark {event['mark']}"
            )
        return Row(t, worker, f"deposit {amount} starts{again}", token, "")
    if kind == "read":
        return Row(t, worker, "reads the balance", token, f"balance {event['balance']}")
    if kind == "wrote":
        outcome = "accepted (token >= mark)" if event.get("checked") else "written: nothing checks"
        return Row(t, worker, f"writes balance {event['balance']}", token, outcome)
    if kind == "refused":
        return Row(
            t, worker, f"writes balance {event['balance']}", token, f"REFUSED: token {token} < mark {event['mark']}"
        )
    if kind == "fenced_out":
        then = f"retry in {RETRY_COUNTDOWN:g}s with a new token" if event["action"] == "retry" else event["action"]
        return Row(t, worker, f"fenced out ({event['phase']}): {then}", token, "")
    return Row(t, worker, kind, token, "")


def render_table(rows: list[Row]) -> str:
    """The timeline as a fixed-width text table."""
    header = Row(0.0, "worker", "action", "token", "storage outcome")
    cells = [(f"{r.t:6.2f}s", r.worker, r.action, r.token, r.outcome) for r in rows]
    titles = ("  time", header.worker, header.action, header.token, header.outcome)
    widths = [max(len(titles[i]), *(len(c[i]) for c in cells)) for i in range(5)]
    lines = ["  ".join(t.ljust(w) for t, w in zip(titles, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    for c in cells:
        lines.append("  ".join(v.ljust(w) for v, w in zip(c, widths, strict=True)).rstrip())
    return "\n".join("  " + line for line in lines)


def verdict(result: RunResult) -> str:
    """One line saying what *result* shows."""
    if not result.fenced:
        if result.lost > 0:
            return (
                f"fencing off: 1 update lost (balance {result.balance}, expected {EXPECTED}: W1's stale write "
                f"destroyed W2's deposit of {result.lost}, and nobody was told)"
            )
        return f"fencing off: nothing lost (balance {result.balance}): the race did not happen"
    if result.lost == 0 and result.refused and result.retried:
        return (
            f"fencing on: stale write rejected, task retried, nothing lost "
            f"(balance {result.balance} = {OPENING_BALANCE} + {FIRST_DEPOSIT} + {SECOND_DEPOSIT})"
        )
    if result.lost == 0:
        return f"fencing on: nothing lost (balance {result.balance}), but no stale write was rejected"
    return f"fencing on: FAILED, balance {result.balance}, expected {EXPECTED}"


def conclude(unfenced: RunResult, fenced: RunResult, out: TextIO) -> int:
    """Print the overall result and return the exit code."""
    if fenced.lost != 0:
        out.write(f"\nFAILED: the fenced run lost an update (balance {fenced.balance}, expected {EXPECTED}).\n")
        return EXIT_FAILED
    if unfenced.lost == 0 or not fenced.refused:
        out.write(
            "\nThe demo proved nothing: the unfenced run should have lost an update and the fenced run should "
            "have refused a stale write.\nRun it again; if this repeats, please report it.\n"
        )
        return EXIT_FAILED
    out.write(
        "\nThe same race, the same workers: without fencing an update vanished silently; with fencing the storage\n"
        "refused the stale write and the task redid its work on fresh data.\n"
        "Fence your own tasks next: see docs/quickstart.md.\n"
    )
    return EXIT_OK
