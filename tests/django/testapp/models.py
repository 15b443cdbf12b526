"""A data row bound to its resource and fenced by its own column, and an append-only log."""

from __future__ import annotations

from django.db import models


class Item(models.Model):
    """A value at a key; ``resource`` and ``fence`` serve column mode."""

    key = models.CharField(max_length=100, primary_key=True)
    value = models.BigIntegerField()
    resource = models.CharField(max_length=200, null=True)
    fence = models.BigIntegerField(null=True)

    class Meta:
        app_label = "fencing_testapp"


class LogEntry(models.Model):
    """One item appended to the log at ``key``; ids follow commit order per resource."""

    key = models.CharField(max_length=100)
    item = models.BigIntegerField()

    class Meta:
        app_label = "fencing_testapp"
