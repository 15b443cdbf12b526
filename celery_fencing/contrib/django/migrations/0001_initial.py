"""Create the mark table ``fencing_high_water`` (adopt an existing one with ``migrate --fake-initial``)."""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import migrations, models

from celery_fencing.contrib.django.models import token_range_constraint


class Migration(migrations.Migration):  # type: ignore[misc]
    initial = True

    dependencies: ClassVar[list[Any]] = []

    operations: ClassVar[list[Any]] = [
        migrations.CreateModel(
            name="HighWaterMark",
            fields=[
                ("resource", models.CharField(max_length=200, primary_key=True, serialize=False)),
                ("token", models.BigIntegerField()),
            ],
            options={
                "db_table": "fencing_high_water",
                "verbose_name": "fencing high-water mark",
                "constraints": [token_range_constraint("fencing_high_water_token_range")],
            },
        ),
    ]
