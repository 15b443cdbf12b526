"""Create the exactly-once table ``fencing_applied``, with the SQL SQLGate's table is made of.

The table is created by ``CREATE TABLE IF NOT EXISTS`` from
:mod:`celery_fencing.gates.applied_sql` (its primary key is (resource,
task_id), which Django before 5.2 cannot declare), so a table that
``SQLGate.create_schema()`` already made is adopted as it is. The model is
unmanaged: this migration's SQL is its only DDL. Databases DjangoGate does
not support get no table.
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import migrations, models

from celery_fencing.contrib.django.models import _COMPOSITE_PK
from celery_fencing.gates.applied_sql import DEFAULT_APPLIED_TABLE, create_table_sql

_VENDORS = ("postgresql", "sqlite")


def create_applied_table(apps: Any, schema_editor: Any) -> None:
    connection = schema_editor.connection
    if connection.vendor in _VENDORS:
        quote = connection.ops.quote_name
        schema_editor.execute(create_table_sql(connection.vendor, quote(DEFAULT_APPLIED_TABLE), quote=quote))


def drop_applied_table(apps: Any, schema_editor: Any) -> None:
    connection = schema_editor.connection
    if connection.vendor in _VENDORS:
        schema_editor.execute(f"DROP TABLE IF EXISTS {connection.ops.quote_name(DEFAULT_APPLIED_TABLE)}")


_KEY: list[Any] = [("pk", models.CompositePrimaryKey("resource", "task_id"))] if _COMPOSITE_PK else []


class Migration(migrations.Migration):  # type: ignore[misc]
    dependencies: ClassVar[list[Any]] = [("celery_fencing", "0002_highwatermark_grantor")]

    operations: ClassVar[list[Any]] = [
        migrations.CreateModel(
            name="AppliedRecord",
            fields=[
                *_KEY,
                ("resource", models.CharField(max_length=200, primary_key=not _COMPOSITE_PK, serialize=False)),
                ("task_id", models.CharField(max_length=200)),
                ("execution", models.CharField(max_length=64)),
                ("token", models.BigIntegerField()),
                ("expires_at", models.BigIntegerField()),
            ],
            options={
                "db_table": DEFAULT_APPLIED_TABLE,
                "managed": False,
                "verbose_name": "fencing applied record",
            },
        ),
        migrations.RunPython(create_applied_table, drop_applied_table),
    ]
