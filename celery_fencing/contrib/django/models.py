"""The high-water mark table, as a Django model: one row per resource.

It has the same name, columns and constraint as :class:`~celery_fencing.SQLGate`'s
table (``fencing_high_water``), so Django code and SQLAlchemy code fencing the
same database share one set of marks. If ``SQLGate.create_schema()`` already
made the table, adopt it with ``manage.py migrate celery_fencing --fake-initial``.

``grantor`` (migration 0002) is the id of the grantor the mark belongs to,
NULL until a token with a grantor passes the mark.
"""

from __future__ import annotations

from typing import Any

import django
from django.db import models

from ...token import MAX_GRANTOR_LENGTH, MAX_RESOURCE_LENGTH, MAX_TOKEN_VALUE

__all__ = ["HighWaterMark", "token_range_constraint"]


def token_range_constraint(name: str) -> Any:
    """``CHECK (token >= 1 AND token <= 2**63 - 1)``, spelt for the running Django version."""
    condition = models.Q(token__gte=1) & models.Q(token__lte=MAX_TOKEN_VALUE)
    # Django 5.1 renamed CheckConstraint(check=...) to condition=; 6.0 drops check=.
    keyword = "condition" if django.VERSION >= (5, 1) else "check"
    return models.CheckConstraint(name=name, **{keyword: condition})


class HighWaterMark(models.Model):  # type: ignore[misc]
    """The highest token accepted for ``resource``, and its grantor. Written only through :class:`DjangoGate`."""

    resource = models.CharField(max_length=MAX_RESOURCE_LENGTH, primary_key=True)
    token = models.BigIntegerField()
    grantor = models.CharField(max_length=MAX_GRANTOR_LENGTH, null=True)

    class Meta:
        db_table = "fencing_high_water"
        constraints = [token_range_constraint("fencing_high_water_token_range")]  # noqa: RUF012
        verbose_name = "fencing high-water mark"

    def __str__(self) -> str:
        return f"{self.resource}: {self.token}" + ("" if self.grantor is None else f" ({self.grantor})")
