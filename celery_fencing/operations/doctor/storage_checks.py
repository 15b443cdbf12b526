"""The storage's part of the check-up: every gate answers, results are fenced, Redis persists.

A gate is read (its mark on the doctor's resource), never written. A Redis
store without persistence (``CONFIG GET appendonly``/``save``) forgets the
marks on restart, and a stale token is accepted again.

A database result backend (``fenced+db+``, ``fenced+django-db``) is looked
at without creating or altering anything: its fence table answers, exists
(``fenced+db+`` creates it on first use; Django's comes from its migrations)
and has its expiry column (migration 0005 on Django), and how long its rows
are kept.
"""

from __future__ import annotations

from typing import Any

from ...exceptions import FencingError
from ...urls import redact_url
from .config_values import url_scheme
from .report import DOCTOR_RESOURCE, Report, join_names

__all__ = ["StorageChecks", "describe_gate"]


class StorageChecks(Report):
    """Checks of the gates, the result backend, and the persistence of Redis stores."""

    def check_gates(self, tasks: list[Any]) -> None:
        from ...celery.runtime import runtime_for

        seen: dict[int, tuple[Any, list[str]]] = {}
        without: list[str] = []
        for task in tasks:
            try:
                gates = runtime_for(self.app).gates(task)
            except Exception as exc:
                self.add(
                    "gates",
                    "error",
                    f"building the gates of task {task.name} raised {type(exc).__name__}: {exc}",
                    "fix the fencing_gates factory; workers would fail the same way",
                )
                continue
            if not gates:
                without.append(task.name)
            for gate in gates:
                seen.setdefault(id(gate), (gate, []))[1].append(task.name)
        if without:
            self.add(
                "gates",
                "note",
                f"claiming no gate when they start: {join_names(without)}. Their writes through a gate are still "
                "fenced, but a read-modify-write in them is not: a paused older execution can write between their read "
                "and their write",
                "give such tasks fencing_gates=[...] naming the gates their data lives behind",
            )
        for gate, users in seen.values():
            label = describe_gate(gate)
            try:
                gate.high_water(DOCTOR_RESOURCE)
            except FencingError as exc:
                self.add(
                    "gates",
                    "error",
                    f"{label} (used by {join_names(users)}) cannot be read: {exc}",
                    "check that the server runs and the URL and credentials are right"
                    + (
                        "; create the mark table if it is missing (gate.create_schema(), or high_water_table() "
                        "in your migrations)"
                        if type(gate).__name__ == "SQLGate"
                        else ""
                    ),
                )
                continue
            self.add("gates", "ok", f"{label} answers (used by {join_names(users)})")
            client = getattr(gate, "client", None)
            if type(gate).__name__ == "RedisGate" and client is not None:
                self.check_redis_persistence(f"gate {label}", client)

    def check_redis_persistence(self, what: str, client: Any) -> None:
        try:
            aof = _config(client, "appendonly")
            save = _config(client, "save")
            fsync = _config(client, "appendfsync")
        except Exception as exc:
            self.add(
                "persistence",
                "note",
                f"cannot read the persistence settings of {what} ({type(exc).__name__}: {exc})",
                "check with your provider that AOF persistence is on: without it a restart forgets the marks",
            )
            return
        if aof == "yes":
            if fsync == "no":
                self.add(
                    "persistence",
                    "note",
                    f"{what}: AOF is on with appendfsync no: the OS decides when marks reach the disk",
                    "CONFIG SET appendfsync everysec (or always), and the same in redis.conf",
                )
            else:
                self.add("persistence", "ok", f"{what}: AOF persistence is on (appendfsync {fsync})")
            return
        fix = "CONFIG SET appendonly yes, and appendonly yes in redis.conf so it survives a restart"
        if save:
            self.add(
                "persistence",
                "warning",
                f"{what}: RDB snapshots only (save {save!r}): a restart rolls the marks back to the last snapshot, "
                "and a stale execution whose token is above the restored mark is accepted again",
                fix,
            )
        else:
            self.add(
                "persistence",
                "warning",
                f"{what}: no persistence (appendonly no, save ''): a restart forgets every mark, and a stale "
                "token is accepted again. That is harmless only if all the data the marks guard lives in this "
                "same Redis and is lost with them",
                fix,
            )

    def check_results(self, tasks: list[Any]) -> None:
        backend_url = self.app.conf.result_backend
        scheme = url_scheme(backend_url)
        with_results = [t.name for t in tasks if not getattr(t, "ignore_result", False)]
        if scheme.startswith("fenced+"):
            self.add("results", "ok", "fenced result backend: a stale execution's result is dropped, never stored")
            try:
                backend = self._result_backend(scheme)
                fence_table = getattr(backend, "inspect_fence_table", None)
                client = None if fence_table is not None else backend.client
            except Exception as exc:
                self.add("results", "error", f"the fenced result backend cannot be built: {exc}", "check its URL")
                return
            if fence_table is not None:
                self.check_result_fences(backend)
            else:
                self.check_redis_persistence("result backend", client)
        elif (scheme in ("redis", "rediss") or _is_database_scheme(scheme)) and with_results:
            plain = "plain django-db" if scheme == "django-db" else f"plain {scheme}://"
            same = "django-celery-results'" if scheme == "django-db" else "the plain"
            self.add(
                "results",
                "warning",
                f"result_backend is {plain}: the result of a stale execution can overwrite the newer "
                f"execution's result (tasks: {join_names(with_results)})",
                f"result_backend = 'fenced+{redact_url(str(backend_url))}' (same options as {same} backend)",
            )
        elif scheme and scheme != "disabled" and with_results:
            self.add(
                "results",
                "note",
                f"result backend {scheme}:// is not fenced: a stale execution's result can overwrite a newer one",
                "use a fenced backend (fenced+redis://, fenced+db+<SQLAlchemy URL>, fenced+django-db); "
                "or set ignore_result=True on fenced tasks",
            )

    def _result_backend(self, scheme: str) -> Any:
        """The result backend, built with Celery's ``database_create_tables_at_setup`` off: doctor writes nothing."""
        conf = self.app.conf
        if not scheme.startswith("fenced+db+"):
            return self.app.backend
        saved = conf.get("database_create_tables_at_setup")
        conf.database_create_tables_at_setup = False
        try:
            return self.app.backend
        finally:
            conf.database_create_tables_at_setup = saved

    def check_result_fences(self, backend: Any) -> None:
        """A database result backend's fence table (answers, exists, expires) and its rows' retention."""
        try:
            state = backend.inspect_fence_table()
        except FencingError as exc:
            self.add(
                "results",
                "error",
                f"the result fence table cannot be read: {_first_line(exc)}",
                "check that the database runs and the result backend's URL and credentials are right",
            )
            return
        if not state.exists and state.fix:
            self.add(
                "results",
                "error",
                f"the result fence table {state.where} does not exist: every fenced task's claim fails",
                state.fix,
            )
        elif not state.exists:
            self.add("results", "ok", f"the result fence table {state.where} is made on the first claim or write")
        elif not state.expiring:
            self.add(
                "results",
                "warning",
                f"the result fence table {state.where} has no expires_at column: the fence rows of tasks that "
                "never stored a result are kept until forget()",
                state.fix
                if state.fix.startswith("manage.py")
                else f"run as the table's owner: {state.fix} (workers add it by themselves when they may)",
            )
        else:
            self.add("results", "ok", f"the result fence table {state.where} answers, with its expiry column")
        self.check_fence_retention(backend)

    def check_fence_retention(self, backend: Any) -> None:
        try:
            retention = backend.fence_retention()
        except FencingError:
            return  # a bad fencing_* setting: the settings check reports it
        if retention is None:
            self.add(
                "results",
                "note",
                "result_expires is unset: results and their fence rows are kept for good",
                "set result_expires and run celery beat: its celery.backend_cleanup task deletes the expired "
                "results and fence rows",
            )
            return
        self.add(
            "results",
            "ok",
            f"fence rows expire {retention:g}s after their last write (result_expires, at least the once-retention); "
            "celery.backend_cleanup, which celery beat runs daily, deletes them",
        )


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _is_database_scheme(scheme: str) -> bool:
    """Celery's SQLAlchemy backend (``db+<URL>``) or django-celery-results' (``django-db``), unfenced."""
    return scheme == "django-db" or scheme.startswith("db+")


def _config(client: Any, name: str) -> str:
    reply = client.config_get(name)
    value = reply.get(name, reply.get(name.encode(), ""))
    return value.decode() if isinstance(value, bytes) else str(value)


def describe_gate(gate: Any) -> str:
    """A short, password-free name for a gate: its kind, server and namespace."""
    kind = type(gate).__name__
    if kind == "RedisGate":
        kwargs = getattr(getattr(gate.client, "connection_pool", None), "connection_kwargs", {})
        where = f"{kwargs.get('host', '?')}:{kwargs.get('port', '?')}/{kwargs.get('db', 0)}"
        if "path" in kwargs:
            where = str(kwargs["path"])
        return f"RedisGate redis://{where} prefix={gate.prefix!r}"
    if kind == "SQLGate":
        url = gate.engine.url.render_as_string(hide_password=True)
        return f"SQLGate {url} table={gate.table.name!r}"
    return kind
