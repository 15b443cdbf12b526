"""The high-water mark table, as a Django model: one row per resource.

It has the same name, columns and constraint as :class:`~celery_fencing.SQLGate`'s
table (``fencing_high_water``), so Django code and SQLAlchemy code fencing the
same database share one set of marks. If ``SQLGate.create_schema()`` already
made the table, adopt it with ``manage.py migrate celery_fencing --fake-initial``.

``grantor`` (migration 0002) is the id of the grantor the mark belongs to,
NULL until a token with a grantor passes the mark.

:class:`AppliedRecord` (migration 0003) is the exactly-once table
``fencing_applied``, the same as SQLGate's (see
:mod:`celery_fencing.gates.applied_sql`).

:class:`ResultFence` (migration 0004) is the fence table of the fenced
django-celery-results backend (``fenced+django-db``), one row per task id,
with the layout of the SQLAlchemy backend's (see :mod:`celery_fencing.celery.db_fence`);
its ``expires_at`` (migration 0005) is when ``cleanup()`` may delete the row.
"""

from __future__ import annotations

from typing import Any

import django
from django.db import models

from ...gates.applied_sql import DEFAULT_APPLIED_TABLE, EXECUTION_ID_LENGTH, MAX_TASK_ID_LENGTH
from ...token import MAX_GRANTOR_LENGTH, MAX_RESOURCE_LENGTH, MAX_TOKEN_VALUE

__all__ = ["AppliedRecord", "HighWaterMark", "ResultFence", "token_range_constraint"]

# Django 5.2 has composite primary keys; before it, the ORM is told resource is the key
# (a record is then readable through the ORM, and must only be written by the gate).
_COMPOSITE_PK = django.VERSION >= (5, 2)


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


class AppliedRecord(models.Model):  # type: ignore[misc]
    """Exactly once: task ``task_id`` applied on ``resource`` by ``execution``, until ``expires_at`` (epoch seconds).

    ``token`` is the execution's token value: above the token of an execution
    that meets the record, it was a newer execution (``superseded``).

    Written only by :class:`~celery_fencing.gates.django.DjangoGate` (and
    SQLGate) in the transaction of the effect. The table is made by
    migration 0003 with SQL shared with SQLGate (primary key (resource,
    task_id)), so the model is unmanaged: read it, never write it here.
    """

    if _COMPOSITE_PK:
        pk = models.CompositePrimaryKey("resource", "task_id")
    resource = models.CharField(max_length=MAX_RESOURCE_LENGTH, primary_key=not _COMPOSITE_PK)
    task_id = models.CharField(max_length=MAX_TASK_ID_LENGTH)
    execution = models.CharField(max_length=EXECUTION_ID_LENGTH)
    token = models.BigIntegerField()
    expires_at = models.BigIntegerField()

    class Meta:
        managed = False
        db_table = DEFAULT_APPLIED_TABLE
        verbose_name = "fencing applied record"

    def __str__(self) -> str:
        return f"{self.task_id} applied on {self.resource} by {self.execution}"


class ResultFence(models.Model):  # type: ignore[misc]
    """The fence of one task's result: its mark (``token``, ``grantor``), ``owner`` resource and sealing execution.

    ``expires_at`` (epoch seconds on the database's clock, NULL for good) is
    when the backend's ``cleanup()`` may delete the row. Written only by
    :class:`~celery_fencing.celery.backend_django.FencedDjangoBackend`, in
    the transaction of the task's ``TaskResult`` row.
    """

    resource = models.CharField(max_length=MAX_TASK_ID_LENGTH, primary_key=True)
    token = models.BigIntegerField()
    grantor = models.CharField(max_length=MAX_GRANTOR_LENGTH, null=True)
    owner = models.CharField(max_length=MAX_RESOURCE_LENGTH, null=True)
    done = models.CharField(max_length=EXECUTION_ID_LENGTH, null=True)
    expires_at = models.BigIntegerField(null=True)

    class Meta:
        db_table = "celery_taskfence"
        constraints = [token_range_constraint("celery_taskfence_token_range")]  # noqa: RUF012
        verbose_name = "fenced task result fence"

    def __str__(self) -> str:
        return f"{self.resource}: {self.token} ({self.owner})"
