"""An account with a balance (and a ``fence`` column for column mode), and the ledger of applied deposits."""

from __future__ import annotations

from django.db import models


class Account(models.Model):
    balance = models.BigIntegerField(default=0)
    #: Column mode's mark for this row (NULL: never fenced).
    fence = models.BigIntegerField(null=True)


class Entry(models.Model):
    account = models.ForeignKey(Account, on_delete=models.CASCADE)
    amount = models.BigIntegerField()
    task_id = models.CharField(max_length=64)
