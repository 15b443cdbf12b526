"""Why a column-mode update matched no row: the same explanation for every SQL gate, no driver import.

A conditional ``UPDATE ... WHERE fence <= token`` that changes nothing says
only that the row was not updated. The SQLAlchemy and Django gates then read
the rows it aimed at (fence, owning resource, fence grantor) and raise what a
gated write would have raised.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ..exceptions import ResourceMismatchError, StaleTokenError
from ..token import FencingToken, check_grantor

__all__ = ["raise_why_refused"]


def raise_why_refused(
    token: FencingToken, rows: Iterable[Sequence[Any]], *, check_owner: bool, check_grantors: bool
) -> None:
    """Raise for the first reason the rows refuse *token*; return if none does (no row matched at all).

    Each row is ``(fence, owning resource, fence grantor)``; the last two are
    only looked at when *check_owner* / *check_grantors* say the table has them.

    :raises ResourceMismatchError: a row belongs to another resource.
    :raises GrantorMismatchError: a row's fence belongs to another grantor.
    :raises StaleTokenError: a row's fence is above the token (with the highest such fence).
    """
    rows = list(rows)
    if check_owner:
        for row in rows:
            if row[1] != token.resource:
                raise ResourceMismatchError(
                    f"row belongs to resource {row[1]!r}, not {token.resource!r}",
                    token_resource=token.resource,
                    expected_resource=row[1],
                )
    if check_grantors:
        for row in rows:
            check_grantor(token, row[2])
    fences = [row[0] for row in rows if row[0] is not None and row[0] > token.value]
    if fences:
        raise StaleTokenError(resource=token.resource, token=token.value, high_water=max(fences))
