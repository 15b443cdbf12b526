"""docs/testing.md shows each route as the complete example file the suite runs, byte for byte."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "testing.md"


def _python_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", PAGE.read_text(), re.M | re.S)


@pytest.mark.parametrize("example", ["app.py", "test_in_process.py", "test_real_workers.py", "test_pytest_celery.py"])
def test_the_page_quotes_the_example_file_whole(example: str) -> None:
    """One python block of the page is exactly examples/testing/<example>."""
    assert (ROOT / "examples" / "testing" / example).read_text() in _python_blocks()


def test_the_page_ends_with_the_containers_section() -> None:
    """The pytest-celery route has its section, last."""
    headings = re.findall(r"^## (.+)$", PAGE.read_text(), re.M)
    assert headings[-1] == "In containers, with pytest-celery"
