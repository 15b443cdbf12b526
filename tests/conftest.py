"""Shared fixtures and how the suite spreads over pytest-xdist workers.

Server fixtures live in tests/fixtures/, one module per server; each xdist
worker is its own pytest session, so it starts its own throwaway servers
(free ports, its own temp dirs) and gets its own SQL databases
(tests/fixtures/services.py).

scripts/test runs the suite with ``--dist loadgroup``: tests are handed out
one by one, except those in one ``xdist_group``, which go to one worker in
order. :func:`pytest_collection_modifyitems` puts into groups

- every test under tests/containers (one group: they share one Docker daemon);
- the tests that use one of the session servers few tests need and that cost
  CPU to start or to keep running (the ZooKeeper ensemble, the etcd cluster,
  the Redis Cluster, the TLS servers): one group per server, so one worker
  starts it instead of every worker;
- the tests of a module that share a module-scoped fixture (one group per
  module and parameter of that fixture), so the fixture (a celery worker, a
  benchmark run) is built once, not once per worker that gets one of them.

A test or module may name its group itself with ``pytest.mark.xdist_group``.

pytest-xdist 3.8 tags a grouped test by renaming ``Node._nodeid``, which
pytest 9 no longer reads (it keeps the id in ``Node._id``), so on its own it
ignores every group under pytest 9 (pytest-dev/pytest-xdist#1386).
tests/xdist_groups.py tags the id pytest 9 reads, as the
proposed fix (#1388) does. No test depends on the grouping for its verdict:
it saves starting a server or a fixture several times.

Tests whose verdict depends on timing a loaded machine distorts (fault-injection
phases that must prove their fault within a deadline, ZooKeeper session expiry,
a pause that must outlast a timeout) are marked ``alone`` here: scripts/test
runs them after the parallel phase, one at a time (``-m alone -n0``), so six
busy workers cannot starve them into a false failure.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = [
    # The testing kit's fixtures (fencing_*), which the ZooKeeper fixtures build on; also loaded by its
    # entry point, and pytest registers it once either way.
    "celery_fencing.testing",
    "tests.fixtures.services",
    "tests.fixtures.zookeeper",
    # After zookeeper: it shares that module's port and process helpers.
    "tests.fixtures.etcd",
    "tests.fixtures.redis_cluster",
    "tests.fixtures.django",
    # Makes --dist loadgroup honour the groups under pytest 9 (see the module docstring).
    "tests.xdist_groups",
]

TESTS = Path(__file__).resolve().parent
CONTAINERS = TESTS / "containers"
SHARED_SCOPES = ("module", "class", "package")
# Timing-sensitive tests (see the module docstring): a directory, a module, or one test's node id.
ALONE = (
    "tests/reliability/",
    "tests/celery/test_zookeeper_workers.py",
    "tests/cli/test_demo.py::test_ctrl_c_stops_workers_and_removes_files",
    "tests/sources/test_zookeeper.py::test_mint_many_times_out_when_the_server_does_not_answer",
    "tests/sources/test_zookeeper.py::test_minting_continues_across_a_leader_kill",
    "tests/sources/test_zookeeper.py::test_frozen_server_bounds_an_in_flight_mint",
    # The server's restart must fit in the session timeout, or the session expires and the test proves nothing.
    "tests/sources/test_zookeeper.py::test_suspended_session_refuses_and_nothing_runs_later",
    "tests/examples/test_examples.py::test_bank_ledger_balances_on_postgresql",
    # Its keys expire 2 s after the last write, and it must see them alive first.
    "tests/celery/test_retention.py::test_fence_state_of_task_ids_expires_with_the_results",
    # The unfenced control loses deposits only when two of its tasks overlap, which a loaded machine may not do.
    "tests/django/test_example.py::test_example_runs_on_postgresql_and_rabbitmq",
)
# The session fixture of each such server, and the kind name under which the source and
# gate contract suites reach it by parameter (request.getfixturevalue, invisible to collection).
SERVER_GROUPS = {
    "_fencing_zookeeper_ensemble_session": "zookeeper-ensemble",
    "zookeeper_ensemble": "zookeeper-ensemble",
    "_etcd_cluster_session": "etcd-cluster",
    "etcd_cluster": "etcd-cluster",
    "redis_cluster": "redis-cluster",
    "certs": "tls-servers",
}


def xdist_group_of(item: pytest.Item) -> str | None:
    """The xdist group *item* belongs in (see the module docstring), or None to run anywhere."""
    path = Path(str(item.path)).resolve()
    if path.is_relative_to(CONTAINERS):
        return "containers"
    fixtureinfo = getattr(item, "_fixtureinfo", None)
    if fixtureinfo is None:
        return None
    callspec = getattr(item, "callspec", None)
    kinds = {value for value in callspec.params.values() if isinstance(value, str)} if callspec else set()
    servers = sorted({SERVER_GROUPS[name] for name in (set(fixtureinfo.names_closure) | kinds) & SERVER_GROUPS.keys()})
    if servers:
        return "+".join(servers)
    shared = sorted(
        name
        for name, defs in fixtureinfo.name2fixturedefs.items()
        if name in fixtureinfo.names_closure and defs and defs[-1].scope in SHARED_SCOPES
    )
    if not shared:
        return None
    params = [f"{name}={callspec.params[name]}" for name in shared if callspec and name in callspec.params]
    module = path.relative_to(TESTS).as_posix()
    return module + (f"[{','.join(params)}]" if params else "")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # tryfirst: xdist reads the marks in its own hook of this name, which must run after this one.
    for item in items:
        nodeid = item.nodeid.split("[", 1)[0]
        if any(nodeid == alone or nodeid.startswith(alone) for alone in ALONE):
            item.add_marker(pytest.mark.alone)
        if item.get_closest_marker("xdist_group") is not None:
            continue
        group = xdist_group_of(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
