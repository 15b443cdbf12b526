"""Give the result fence ``celery_taskfence`` its expiry, ``expires_at``: the backend's ``cleanup()`` deletes old rows.

Rows that exist already keep NULL: they go with their results in
``cleanup()``, as before this column; every accepted claim, seal and write
sets it from then on.
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import migrations, models


class Migration(migrations.Migration):  # type: ignore[misc]
    dependencies: ClassVar[list[Any]] = [("celery_fencing", "0004_resultfence")]

    operations: ClassVar[list[Any]] = [
        migrations.AddField(model_name="resultfence", name="expires_at", field=models.BigIntegerField(null=True)),
    ]
