"""The story the demo plays: the account, the two deposits, the two workers, and what one run of it yields."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "ACCOUNT",
    "EXPECTED",
    "FIRST_DEPOSIT",
    "OPENING_BALANCE",
    "SECOND_DEPOSIT",
    "WORKERS",
    "Row",
    "RunResult",
]

ACCOUNT = 42
OPENING_BALANCE = 100
FIRST_DEPOSIT = 10  # by W1, which is frozen between its read and its write
SECOND_DEPOSIT = 20  # by W2, while W1 is frozen
EXPECTED = OPENING_BALANCE + FIRST_DEPOSIT + SECOND_DEPOSIT
WORKERS = ("W1", "W2")


@dataclass
class Row:
    """One line of a run's timeline: when, who, what, with which token, and what the storage said."""

    t: float
    worker: str
    action: str
    token: str
    outcome: str


@dataclass
class RunResult:
    """One run of the story (fencing on or off): its timeline, the final balance, refusals and retries."""

    fenced: bool
    rows: list[Row]
    balance: int
    refused: int
    retried: int

    @property
    def lost(self) -> int:
        return EXPECTED - self.balance
