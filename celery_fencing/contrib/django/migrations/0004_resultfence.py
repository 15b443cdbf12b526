"""Create the fence table ``celery_taskfence`` of the fenced django-celery-results backend (``fenced+django-db``)."""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import migrations, models

from celery_fencing.contrib.django.models import token_range_constraint


class Migration(migrations.Migration):  # type: ignore[misc]
    dependencies: ClassVar[list[Any]] = [("celery_fencing", "0003_appliedrecord")]

    operations: ClassVar[list[Any]] = [
        migrations.CreateModel(
            name="ResultFence",
            fields=[
                ("resource", models.CharField(max_length=200, primary_key=True, serialize=False)),
                ("token", models.BigIntegerField()),
                ("grantor", models.CharField(max_length=64, null=True)),
                ("owner", models.CharField(max_length=200, null=True)),
                ("done", models.CharField(max_length=64, null=True)),
            ],
            options={
                "db_table": "celery_taskfence",
                "verbose_name": "fenced task result fence",
                "constraints": [token_range_constraint("celery_taskfence_token_range")],
            },
        ),
    ]
