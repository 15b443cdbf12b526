"""The token source's part of the check-up: configured, reachable, monotonic; and its ensemble.

Two tokens are minted on the doctor's own resource (``celery-fencing:doctor``)
and the second must be larger. ZooKeeper's session timeout is checked against
``fencing_timeout`` and the server's negotiation bounds, etcd's ``lease_ttl``
against ``fencing_timeout`` in exclusive mode, and both ensembles' sizes.
"""

from __future__ import annotations

from typing import Any

from ...exceptions import FencingConfigurationError, FencingError, TokenUnavailableError
from ...urls import redact_url
from .report import DOCTOR_RESOURCE, Report

__all__ = ["ZOOKEEPER_MIN_SESSION", "SourceChecks"]

#: ZooKeeper negotiates session timeouts within [2, 20] x tickTime; tickTime defaults to 2000 ms.
ZOOKEEPER_MIN_SESSION = 4.0


class SourceChecks(Report):
    """Checks of the token source, and of the ensemble behind it."""

    def check_source(self, settings: Any) -> Any:
        from ...celery.runtime import runtime_for

        if settings.source is None:
            self.add(
                "source",
                "error",
                "no token source: fencing_source is not set",
                "app.conf.fencing_source = 'zookeeper://zk1:2181,zk2:2181,zk3:2181/fencing' "
                "(or pass --fencing-source to every worker)",
            )
            return None
        shown = redact_url(settings.source) if isinstance(settings.source, str) else type(settings.source).__name__
        try:
            source = runtime_for(self.app).source()
        except FencingConfigurationError as exc:
            self.add("source", "error", str(exc), "use zookeeper:// (several hosts) or sqlite:// (one host)")
            return None
        try:
            first = source.mint(DOCTOR_RESOURCE, timeout=settings.timeout)
            second = source.mint(DOCTOR_RESOURCE, timeout=settings.timeout)
        except TokenUnavailableError as exc:
            self.add(
                "source",
                "error",
                f"{shown} is unreachable: {exc}",
                "check the hosts and that the servers run; workers cannot start fenced tasks without it "
                "(they retry, then fail)",
            )
            return None
        except FencingError as exc:
            self.add("source", "error", f"{shown} failed to mint: {exc}", "check the source URL and its server")
            return None
        if second.value <= first.value:
            self.add(
                "source",
                "error",
                f"{shown} is not monotonic: minted {first.value} then {second.value}",
                "tokens must strictly increase: use zookeeper:// or sqlite://, never a clock or a resettable counter",
            )
            return source
        self.add("source", "ok", f"{shown} answers and is monotonic: minted {first.value} then {second.value}")
        if getattr(source, "volatile", False):
            self.add(
                "source",
                "error",
                f"{type(source).__name__} is volatile: a restart resets its counter below the marks the gates hold",
                "use zookeeper:// or sqlite://; keep memory:// for tests (fencing_allow_volatile_source)",
            )
        elif type(source).__name__ == "SQLiteTokenSource":
            self.add(
                "source",
                "note",
                "a SQLite token source is one file on one host: workers on other hosts would mint from their own "
                "file, and their tokens would not be ordered against these",
                "run every worker on this host, or use zookeeper:// for several hosts",
            )
        return source

    def check_ensemble(self, area: str, kind: str, hosts: list[str]) -> None:
        count = len(hosts)
        if count == 1:
            self.add(
                area,
                "warning",
                f"one {kind} server ({hosts[0]}): when it is down no token can be minted and fenced tasks stop",
                "run 3 servers (tolerates 1 failure) or 5 (tolerates 2), and list every one in the URL",
            )
        elif count % 2 == 0:
            self.add(
                area,
                "note",
                f"{count} {kind} servers listed: an even ensemble tolerates no more failures than one server fewer",
                f"use {count - 1} or {count + 1} servers",
            )
        else:
            self.add(area, "ok", f"{count} {kind} servers listed (a quorum survives {count // 2} failures)")

    def check_grantor(self, source: Any, settings: Any, tasks: list[Any]) -> None:
        kind = type(source).__name__
        exclusive = settings.mode == "exclusive" or any(getattr(t, "fencing_mode", None) == "exclusive" for t in tasks)
        if kind == "EtcdTokenSource":
            self.check_ensemble("etcd", "etcd", list(getattr(source, "endpoints", ())))
            ttl = getattr(source, "lease_ttl", None)
            if exclusive and ttl is not None and settings.timeout >= ttl:
                self.add(
                    "etcd",
                    "warning",
                    f"fencing_timeout={settings.timeout:g}s is not below the etcd lease_ttl ({ttl:g}s): a task can "
                    "wait for a lock longer than a dead holder keeps it",
                    f"set fencing_timeout below lease_ttl, e.g. {ttl / 2:g}, or raise ?lease_ttl= in the URL",
                )
            return
        if kind == "ZooKeeperTokenSource":
            self.check_zookeeper(source, settings, exclusive)

    def check_zookeeper(self, source: Any, settings: Any, exclusive: bool) -> None:
        session = float(source.session_timeout)
        hosts = getattr(source, "hosts", None)
        if isinstance(hosts, str):
            self.check_ensemble("zookeeper", "ZooKeeper", [h.strip() for h in hosts.split(",") if h.strip()])
        if session < ZOOKEEPER_MIN_SESSION:
            self.add(
                "zookeeper",
                "warning",
                f"session_timeout={session:g}s is below what ZooKeeper grants (2 x tickTime, 4 s by default): "
                "the server silently raises it",
                "ask for session_timeout=10 or more in the source URL (?session_timeout=10)",
            )
        if settings.timeout >= session:
            self.add(
                "zookeeper",
                "warning",
                f"fencing_timeout={settings.timeout:g}s is not below the ZooKeeper session timeout ({session:g}s): "
                "a mint can wait out a whole session expiry, and in exclusive mode the lease it waits for may "
                "already belong to another worker",
                f"set fencing_timeout below the session timeout, e.g. {session / 2:g}, or raise ?session_timeout=",
            )
        else:
            self.add(
                "zookeeper",
                "ok",
                f"fencing_timeout={settings.timeout:g}s is below the session timeout ({session:g}s)",
            )
        if exclusive and not settings.abort_on_session_loss:
            self.add(
                "zookeeper",
                "note",
                "exclusive mode without fencing_abort_on_session_loss: a task whose session was lost keeps running "
                "until its next gate write is refused",
                "set fencing_abort_on_session_loss = True to stop it at its next gate call",
            )
