"""The configuration reference cannot drift from the code: every setting, flag and option is in it."""

from __future__ import annotations

from pathlib import Path

from celery_fencing.celery.options import TASK_OPTIONS
from celery_fencing.celery.settings import SETTINGS

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_every_setting_and_flag_is_documented() -> None:
    """Each setting's name, flag and default appear in one row of docs/configuration.md."""
    section = REFERENCE.read_text().split("## Settings and worker flags", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `fencing_")]
    documented = {row.split("`")[1]: row for row in rows}
    for setting in SETTINGS:
        row = documented.get(setting.name)
        assert row is not None, f"{setting.name} missing from {REFERENCE.name}"
        assert f"`{setting.flag}" in row, f"{setting.flag} missing from its row"
        if setting.default is not None:
            assert f"`{setting.default}`" in row, f"default {setting.default!r} of {setting.name} not in its row"


def test_every_task_option_is_documented() -> None:
    """Each FencedTask option has a row in the task options table."""
    text = REFERENCE.read_text()
    section = text.split("## Task options", 1)[1]
    for option in TASK_OPTIONS:
        assert f"| `{option}` |" in section, option


def test_no_undocumented_extra_rows() -> None:
    """The reference lists no setting the code does not have."""
    names = {setting.name for setting in SETTINGS} | set(TASK_OPTIONS)
    rows = [line.split("`")[1] for line in REFERENCE.read_text().splitlines() if line.startswith("| `fencing_")]
    assert set(rows) <= names
