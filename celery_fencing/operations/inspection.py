"""``celery-fencing inspect``: a resource's last token and its high-water marks, side by side.

Nothing is minted, claimed or written. The last token is *peeked* where the
source allows it:

* SQLite: the counter row, read from the file opened read-only;
* ZooKeeper: the ``mzxid`` of the resource's token znode (``<root>/tokens/<name>``),
  which is exactly the last token minted for it;
* etcd: the ``mod_revision`` of the resource's token key (``<prefix>/tokens/<name>``),
  the revision of the last put, which is the last token;
* memory: not possible from outside its process, and said so.

A mark above the source's last token is the one alarming reading: the source
was reset (a deleted SQLite file, a ZooKeeper ensemble that lost its data
directory) or points at the wrong place, and every new token will be refused
until the source catches up. It is reported as a finding (exit code 1).

Grantor ids (see the Security page of the docs) make the two causes tell
apart: the source's id is read (``<root>/grantor``, the SQLite file's
``fencing_grantor`` table, ``<prefix>/grantor`` in etcd) and each mark's
grantor is read with it. A mark of *another* grantor is a replaced or wiped
grantor (``celery-fencing rebase``); a mark of the *same* grantor above its
counter is implausibly high, a forged or corrupted token that got in
(``celery-fencing repair``).
"""

from __future__ import annotations

import base64
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

from ..exceptions import FencingConfigurationError, FencingError, InvalidTokenError
from ..protocols import AppliedRecords
from ..token import Mark, validate_grantor, validate_resource
from ..urls import query_params, redact_url, split_url
from .urls import OpenedGate

__all__ = ["Peek", "ResourceReport", "inspect_resources", "open_peeker"]


@dataclass(frozen=True)
class Peek:
    """The last token minted for a resource, as far as the source lets us see it.

    ``value`` is ``None`` when nothing was minted for the resource yet, or when
    ``supported`` is false (the source cannot be read without minting).
    """

    value: int | None
    supported: bool = True
    note: str = ""
    #: The highest token the source can have issued for the resource, where that
    #: is more than ``value`` (ZooKeeper: the ensemble's last zxid, since task ids
    #: mint through one shared znode); ``None``: ``value`` is the bound.
    bound: int | None = None


class Peeker(Protocol):
    description: str

    def peek(self, resource: str) -> Peek: ...

    def close(self) -> None: ...


class SQLitePeeker:
    """Reads the counters of a SQLite token source, read-only."""

    def __init__(self, url: str) -> None:
        parts = split_url(url, "sqlite:// URL")
        if parts.netloc:
            raise FencingConfigurationError(
                f"sqlite:// takes no host: write sqlite:///relative/path.db or sqlite:////absolute/path.db, got {url!r}"
            )
        path = parts.path[1:] if parts.path.startswith("/") else parts.path
        if not path:
            raise FencingConfigurationError(f"sqlite:// URL {url!r} names no database file")
        query_params(parts, {"timeout"}, what="sqlite:// URL", shown=url)
        if not Path(path).is_file():
            raise FencingConfigurationError(
                f"token database {path!r} does not exist: nothing was minted there, or the path is wrong"
            )
        self.description = f"SQLite token file {path}"
        try:
            self._conn = sqlite3.connect(f"file:{quote(path)}?mode=ro", uri=True, timeout=5)
            self._conn.execute("SELECT resource, value FROM fencing_tokens LIMIT 0")
        except sqlite3.Error as exc:
            raise FencingConfigurationError(f"{path!r} is not a readable token database: {exc}") from exc
        try:
            row = self._conn.execute("SELECT id FROM fencing_grantor WHERE singleton = 1").fetchone()
        except sqlite3.Error:
            row = None  # a file made before grantor ids
        self.grantor = _grantor_or_none(row[0] if row else None)

    def peek(self, resource: str) -> Peek:
        try:
            row = self._conn.execute("SELECT value FROM fencing_sequence WHERE singleton = 1").fetchone()
            counter = None if row is None else int(row[0])
        except sqlite3.Error:
            counter = None  # a file of a version with one counter per resource
        row = self._conn.execute("SELECT value FROM fencing_tokens WHERE resource = ?", (resource,)).fetchone()
        last = None if row is None else int(row[0])
        # One counter for every resource (task ids mint without a row): it bounds what the resource can have.
        bound = counter if counter is not None and counter > (last or 0) else None
        return Peek(last, note="never minted" if last is None else "", bound=bound)

    def close(self) -> None:
        self._conn.close()


class ZooKeeperPeeker:
    """Reads the ``mzxid`` of token znodes: the last token minted, without minting."""

    def __init__(self, url: str) -> None:
        try:
            from kazoo.client import KazooClient

            from ..sources.zookeeper import ZooKeeperTokenSource
        except ImportError as exc:
            raise FencingConfigurationError(
                f"zookeeper:// needs kazoo: pip install 'celery-fencing[zookeeper]' ({exc})"
            ) from exc
        source = ZooKeeperTokenSource.from_url(url)  # validates the URL; never connected
        self.hosts = source.hosts or ""
        self.root = source.root
        self.timeout = source.timeout
        # The same digest credentials and TLS as the workers' source (ACL-protected znodes).
        options = source.client_options()
        source.close()
        self.description = f"ZooKeeper {self.hosts}{self.root}"
        self._client = KazooClient(hosts=self.hosts, timeout=self.timeout, **options)
        try:
            self._client.start(timeout=self.timeout)
        except Exception as exc:
            self._client.close()
            raise FencingConfigurationError(
                f"cannot reach ZooKeeper at {self.hosts} within {self.timeout:g}s: {exc}"
            ) from exc
        try:
            data, _ = self._client.get_async(f"{self.root}/grantor").get(timeout=self.timeout)
        except Exception:
            data = None  # no grantor id yet (never minted, or minted by an older version)
        self.grantor = _grantor_or_none(bytes(data).decode("ascii", "replace") if data else None)
        try:
            data, _ = self._client.get_async(f"{self.root}/token-scale").get(timeout=self.timeout)
            # Tokens are zxids times 2**bits (blocks); a root of an older version has raw zxids.
            self.scale_bits = int(bytes(data or b"0").decode("ascii", "replace").strip() or 0)
        except Exception:
            self.scale_bits = 0

    def peek(self, resource: str) -> Peek:
        from ..sources.zookeeper import resource_to_znode_name

        path = f"{self.root}/tokens/{resource_to_znode_name(resource)}"
        stat = self._client.exists_async(path).get(timeout=self.timeout)
        # zxids are global: any token of any resource is at most the ensemble's last
        # zxid, and resources minted with mint_transient (task ids) have no znode of
        # their own. Read it after a sync, so it covers every write committed before.
        self._client.sync_async(self.root).get(timeout=self.timeout)
        self._client.exists_async(self.root).get(timeout=self.timeout)
        bits = self.scale_bits
        # The last zxid's block may hand out tokens up to the next zxid's first, less one.
        bound = ((int(self._client.last_zxid) + 1) << bits) - 1
        if stat is None:
            return Peek(None, note="no znode", bound=bound)
        return Peek(int(stat.mzxid) << bits, bound=bound)

    def close(self) -> None:
        try:
            self._client.stop()
        finally:
            self._client.close()


class EtcdPeeker:
    """Reads the ``mod_revision`` of token keys: the revision of the last put, i.e. the last token minted."""

    def __init__(self, url: str) -> None:
        from ..sources.etcd import EtcdTokenSource

        source = EtcdTokenSource.from_url(url)  # validates the URL; sends nothing
        self.endpoints = list(source.endpoints)
        self.prefix = source.prefix
        self.timeout = source.timeout
        source.close()
        self.description = f"etcd {','.join(self.endpoints)}{self.prefix}"
        self._range(self.prefix)  # fail now, clearly, if no member answers
        kvs = self._range(f"{self.prefix}/grantor").get("kvs") or []
        raw = base64.b64decode(kvs[0].get("value", "")).decode("ascii", "replace") if kvs else None
        self.grantor = _grantor_or_none(raw)

    def _range(self, key: str) -> dict[str, Any]:
        import base64
        import http.client
        import json

        body = json.dumps({"key": base64.b64encode(key.encode()).decode()}).encode()
        errors = []
        for endpoint in self.endpoints:
            host, _, port = endpoint.rpartition(":")
            conn = http.client.HTTPConnection(host.strip("[]"), int(port), timeout=self.timeout)
            try:
                conn.request("POST", "/v3/kv/range", body=body, headers={"Content-Type": "application/json"})
                response = conn.getresponse()
                raw = response.read()
                if response.status == 200:
                    reply: dict[str, Any] = json.loads(raw)
                    return reply
                errors.append(f"{endpoint}: HTTP {response.status} {raw[:120]!r}")
            except (OSError, http.client.HTTPException, ValueError) as exc:
                errors.append(f"{endpoint}: {type(exc).__name__}: {exc}")
            finally:
                conn.close()
        raise FencingConfigurationError(f"cannot reach etcd at {','.join(self.endpoints)}: {'; '.join(errors)}")

    def peek(self, resource: str) -> Peek:
        from ..sources.etcd import resource_to_key_name

        reply = self._range(f"{self.prefix}/tokens/{resource_to_key_name(resource)}")
        kvs = reply.get("kvs") or []
        if not kvs:
            return Peek(None, note="never minted")
        return Peek(int(kvs[0]["mod_revision"]))

    def close(self) -> None:
        pass


class UnpeekablePeeker:
    """A source whose counter cannot be read from outside (memory://)."""

    def __init__(self, url: str, reason: str) -> None:
        self.description = redact_url(url)
        self.reason = reason

    grantor = None

    def peek(self, resource: str) -> Peek:
        return Peek(None, supported=False, note=self.reason)

    def close(self) -> None:
        pass


def _grantor_or_none(raw: object) -> str | None:
    try:
        return validate_grantor(raw)
    except InvalidTokenError:
        return None


def open_peeker(url: str) -> Peeker:
    """A read-only view of the token source *url*.

    :raises FencingConfigurationError: malformed URL, unknown scheme, missing
        database file, unreachable server.
    """
    if not isinstance(url, str) or "://" not in url:
        raise FencingConfigurationError(
            f"token source URL must look like 'zookeeper://host:2181/root' or 'sqlite:///tokens.db', got {url!r}"
        )
    scheme = split_url(url, "token source URL").scheme.lower()
    if scheme == "sqlite":
        return SQLitePeeker(url)
    if scheme == "zookeeper":
        return ZooKeeperPeeker(url)
    if scheme == "etcd":
        return EtcdPeeker(url)
    if scheme == "memory":
        return UnpeekablePeeker(url, "memory:// lives inside one process: its counter cannot be read from here")
    raise FencingConfigurationError(
        f"unknown token source scheme {scheme!r} in {redact_url(url)!r}; known schemes: etcd, memory, sqlite, zookeeper"
    )


@dataclass
class ResourceReport:
    """One resource: its last token, its mark at each gate, and what is wrong, if anything."""

    resource: str
    last_token: int | None
    peek_supported: bool
    peek_note: str
    marks: list[tuple[str, int | None]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    #: The grantor of each mark, in the order of ``marks`` (``None``: none recorded, or no mark).
    mark_grantors: list[str | None] = field(default_factory=list)
    #: "ok", "GRANTOR MISMATCH" or "MARK AHEAD OF SOURCE".
    status: str = "ok"
    #: Hints that are not findings (say, a Redis prefix under which no mark exists at all).
    notes: list[str] = field(default_factory=list)
    #: Exactly-once records asked for (``--task-id``): (gate label, task id, execution id or ``None``).
    applied: list[tuple[str, str, str | None]] = field(default_factory=list)
    #: The highest token the source can have issued for the resource, when that is more
    #: than ``last_token`` (ZooKeeper: the ensemble's last zxid).
    issued_bound: int | None = None

    def to_json(self) -> dict[str, Any]:
        grantors = self.mark_grantors + [None] * (len(self.marks) - len(self.mark_grantors))
        return {
            "resource": self.resource,
            "last_token": self.last_token,
            "peek_supported": self.peek_supported,
            "peek_note": self.peek_note,
            "issued_bound": self.issued_bound,
            "marks": [
                {"gate": gate, "high_water": mark, "grantor": grantor}
                for (gate, mark), grantor in zip(self.marks, grantors, strict=True)
            ],
            "applied": [
                {"gate": gate, "task_id": task_id, "execution": execution} for gate, task_id, execution in self.applied
            ],
            "problems": self.problems,
            "notes": self.notes,
            "status": self.status,
        }


def inspect_resources(
    peeker: Peeker, gates: list[OpenedGate], resources: list[str], task_ids: list[str] | None = None
) -> list[ResourceReport]:
    """Read every resource's last token and marks, and the exactly-once records of *task_ids* on it.

    :raises FencingConfigurationError: a bad resource name, or a server that
        could not be read (naming it).
    """
    for resource in resources:
        try:
            validate_resource(resource)
        except InvalidTokenError as exc:
            raise FencingConfigurationError(f"bad resource name {resource!r}: {exc}") from exc
    reports = []
    for resource in resources:
        try:
            peek = peeker.peek(resource)
        except FencingError:
            raise
        except Exception as exc:
            raise FencingConfigurationError(f"cannot read {peeker.description}: {exc}") from exc
        report = ResourceReport(resource, peek.value, peek.supported, peek.note, issued_bound=peek.bound)
        source_grantor: str | None = getattr(peeker, "grantor", None)
        for opened in gates:
            try:
                read_mark = getattr(opened.gate, "mark", None)
                full: Mark | None = read_mark(resource) if callable(read_mark) else None
                mark = full.value if full is not None else opened.gate.high_water(resource)
            except FencingError as exc:
                hint = ""
                missing = ("does not exist", "doesn't exist", "no such table")
                if opened.kind == "sql" and any(text in str(exc) for text in missing):
                    hint = " (wrong --sql-table? the gate's table is made by SQLGate.create_schema())"
                raise FencingConfigurationError(f"cannot read the mark at {opened.label}: {exc}{hint}") from exc
            report.marks.append((opened.label, mark))
            for task_id in task_ids or ():
                records = opened.gate if isinstance(opened.gate, AppliedRecords) else None
                report.applied.append((opened.label, task_id, records.applied(resource, task_id) if records else None))
            mark_grantor = full.grantor if full is not None else None
            report.mark_grantors.append(mark_grantor)
            if mark_grantor is not None and source_grantor is not None and mark_grantor != source_grantor:
                # Tokens of two grantors do not compare: "above the counter" would mean nothing here.
                report.status = "GRANTOR MISMATCH"
                report.problems.append(
                    f"mark {mark} at {opened.label} belongs to grantor {mark_grantor}, but the source is grantor "
                    f"{source_grantor}: every new token is refused with GrantorMismatchError. If the grantor was "
                    "replaced (a wiped ZooKeeper, a new token file), `celery-fencing rebase` moves the mark to it"
                )
                continue
            limit = peek.value if peek.bound is None else max(peek.bound, peek.value or 0)
            if mark is not None and peek.supported and (limit is None or mark > limit):
                if report.status == "ok":
                    report.status = "MARK AHEAD OF SOURCE"
                if mark_grantor is not None and mark_grantor == source_grantor:
                    report.problems.append(
                        f"mark {mark} at {opened.label} is above anything grantor {mark_grantor} has issued for "
                        "it (the highest token issued is "
                        f"{'none' if limit is None else limit}): a forged or corrupted token got in, and "
                        "every honest token is refused until the grantor counts past it; `celery-fencing repair` "
                        "lowers the mark to a fresh token"
                    )
                    continue
                last = "no token was ever minted" if limit is None else f"the highest token issued is {limit}"
                report.problems.append(
                    f"mark {mark} at {opened.label} is above the source's counter ({last}): the source was reset "
                    "or is not the one the workers use; every new token is refused until it passes the mark "
                    "(if the grantor was replaced, `celery-fencing rebase` moves the marks to it)"
                )
        reports.append(report)
    _note_empty_prefixes(gates, reports)
    return reports


def _note_empty_prefixes(gates: list[OpenedGate], reports: list[ResourceReport]) -> None:
    """A Redis gate where no resource asked for has a mark, and the prefix holds no mark at all: a wrong prefix?

    Said as a note on every report (it is not a finding: a new deployment has no
    marks yet), so a mistyped ``--redis-prefix`` does not pass as "no mark, ok".
    """
    for index, opened in enumerate(gates):
        if opened.kind != "redis" or any(report.marks[index][1] is not None for report in reports):
            continue
        prefix = getattr(opened.gate, "prefix", "fencing")
        try:
            cursor, keys = opened.client.scan(0, match=f"{prefix}:mark:*", count=1000)
            # Bounded: on a large keyspace, 100 rounds (about 100,000 keys) and no verdict.
            for _ in range(100):
                if keys or not cursor:
                    break
                cursor, keys = opened.client.scan(cursor, match=f"{prefix}:mark:*", count=1000)
        except Exception as exc:  # the marks were read a moment ago; this is only a hint
            raise FencingConfigurationError(f"cannot scan {opened.label} for marks: {exc}") from exc
        if not keys and not cursor:
            for report in reports:
                report.notes.append(
                    f"no mark at all under the prefix {prefix!r} at {opened.label}: is --redis-prefix the "
                    "prefix of the workers' RedisGate?"
                )
