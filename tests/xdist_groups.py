"""A pytest plugin that makes ``--dist loadgroup`` honour ``xdist_group`` under pytest 9.

pytest-xdist 3.8 tells its scheduler a test's group by appending ``@group`` to
the test's id: it writes ``Node._nodeid``, which pytest 9 no longer reads (a
node keeps its id as a structured ``Node._id``). The groups are then silently
ignored (pytest-dev/pytest-xdist#1386). This plugin appends the group to the id
pytest 9 reads, as the proposed fix (pytest-dev/pytest-xdist#1388) does; where
xdist already tagged the id (pytest 8, or a fixed xdist) it does nothing.
tests/unit/test_xdist_groups.py checks that grouped tests share one worker.
"""

from __future__ import annotations

import pytest

try:  # pytest 9: a node's id is a NodeId
    from _pytest.nodeid import NodeId
except ImportError:  # pytest 8: xdist's own tag works
    NodeId = None  # type: ignore[assignment,misc]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    # After pytest_collection_modifyitems, where xdist tags Node._nodeid, and before xdist's own
    # hook of this name sends the ids to the scheduler (which groups by the text after "@").
    if NodeId is None or not getattr(session.config.option, "loadgroup", False):
        return
    for item in session.items:
        marks = item.iter_markers("xdist_group")
        names = sorted({str(mark.args[0] if mark.args else mark.kwargs.get("name", "default")) for mark in marks})
        if names and "@" not in item.nodeid.rpartition("]")[2]:
            item._id = NodeId.parse(f"{item.nodeid}@{'_'.join(names)}")
