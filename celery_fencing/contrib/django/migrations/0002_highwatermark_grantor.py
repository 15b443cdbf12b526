"""Add the ``grantor`` column to ``fencing_high_water``: the id of the grantor each mark belongs to.

Existing marks get NULL and adopt the grantor of the first token that passes
them. ``initial = True`` lets ``migrate --fake-initial`` adopt a table that
``SQLGate.create_schema()`` made with the column already there; a table without
it (from 0001, or an older SQLGate) gets the column added.
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import migrations, models


class Migration(migrations.Migration):  # type: ignore[misc]
    initial = True

    dependencies: ClassVar[list[Any]] = [("celery_fencing", "0001_initial")]

    operations: ClassVar[list[Any]] = [
        migrations.AddField(
            model_name="highwatermark",
            name="grantor",
            field=models.CharField(max_length=64, null=True),
        ),
    ]
