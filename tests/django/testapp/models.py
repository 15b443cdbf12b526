"""Test models: a data row bound to its resource and fenced by its own columns, a log, and a legacy mark model."""

from __future__ import annotations

from django.db import models


class Item(models.Model):
    """A value at a key; ``resource``, ``fence`` and ``fence_grantor`` serve column mode."""

    key = models.CharField(max_length=100, primary_key=True)
    value = models.BigIntegerField()
    resource = models.CharField(max_length=200, null=True)
    fence = models.BigIntegerField(null=True)
    fence_grantor = models.CharField(max_length=64, null=True)

    class Meta:
        app_label = "fencing_testapp"


class LogEntry(models.Model):
    """One item appended to the log at ``key``; ids follow commit order per resource."""

    key = models.CharField(max_length=100)
    item = models.BigIntegerField()

    class Meta:
        app_label = "fencing_testapp"


class LegacyMark(models.Model):
    """A custom mark model made before grantor ids: ``resource`` and ``token`` only."""

    resource = models.CharField(max_length=200, primary_key=True)
    token = models.BigIntegerField()

    class Meta:
        app_label = "fencing_testapp"
        db_table = "fencing_legacy_marks"
