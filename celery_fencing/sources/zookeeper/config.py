"""Configuration: the URL, hosts, root, timeouts, digest credentials and TLS, checked before any client exists.

Everything here is pure validation and raises
:class:`~celery_fencing.FencingConfigurationError` naming what is wrong. The
password never appears in a message (URLs are shown redacted, a bad digest
is not echoed), and the clients the source builds log through
:data:`KAZOO_LOGGER`, which masks it in kazoo's own DEBUG records.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
import time
from typing import Any, NamedTuple
from urllib.parse import unquote

from kazoo.protocol.serialization import Auth
from kazoo.security import make_digest_acl

from ...blocks import DEFAULT_BLOCK_SIZE
from ...exceptions import FencingConfigurationError
from ...urls import parse_block, parse_seconds, query_params, split_scheme_url

__all__ = [
    "KAZOO_LOGGER",
    "UrlSettings",
    "ZooKeeperTLS",
    "client_options",
    "parse_url",
    "validate_digest",
    "validate_hosts",
    "validate_root",
]

_HOST_PORT = re.compile(r"^(?:\[(?P<ipv6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9_.-]+))(?::(?P<port>[0-9]{1,5}))?$")
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
_TLS_PARAMS = frozenset({"tls", "ca", "certfile", "keyfile", "verify_certs"})


def validate_root(root: object) -> str:
    if not isinstance(root, str) or not root.startswith("/"):
        raise FencingConfigurationError(f"ZooKeeper root must be an absolute znode path like '/fencing', got {root!r}")
    stripped = root.rstrip("/")
    parts = stripped.split("/")[1:]
    if not parts:
        raise FencingConfigurationError("ZooKeeper root must name a znode below '/', e.g. '/fencing'")
    for part in parts:
        if part in ("", ".", ".."):
            raise FencingConfigurationError(f"ZooKeeper root {root!r} has an empty, '.' or '..' component")
        for char in part:
            code = ord(char)
            if code < 0x20 or 0x7F <= code < 0xA0 or 0xD800 <= code < 0xF900 or code >= 0xFFF0:
                raise FencingConfigurationError(f"ZooKeeper root {root!r} contains the invalid character {char!r}")
    if parts[0] == "zookeeper":
        raise FencingConfigurationError(f"ZooKeeper root {root!r} is inside /zookeeper, which ZooKeeper reserves")
    return stripped


def validate_hosts(hosts: object, url: str | None = None) -> str:
    where = f" in {url!r}" if url is not None else ""
    if not isinstance(hosts, str) or not hosts.strip():
        raise FencingConfigurationError(f"ZooKeeper hosts must be 'host:port[,host:port...]'{where}, got {hosts!r}")
    for item in hosts.split(","):
        match = _HOST_PORT.match(item.strip())
        if match is None:
            raise FencingConfigurationError(f"malformed ZooKeeper host {item!r}{where}: expected host:port")
        port = match.group("port")
        if port is not None and not 0 < int(port) < 65536:
            raise FencingConfigurationError(f"ZooKeeper port {port} out of range{where}")
    return hosts


@dataclasses.dataclass(frozen=True)
class ZooKeeperTLS:
    """TLS to the ensemble's ``secureClientPort`` (kazoo's ``use_ssl``).

    :param ca: PEM file of the CA that signed the servers' certificates
        (default: the system's trust store).
    :param certfile: PEM client certificate, for servers with ``ssl.clientAuth=need``.
    :param keyfile: PEM key of *certfile*.
    :param verify_certs: check the server's certificate (and host name). Only
        turn it off to test.
    """

    ca: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    verify_certs: bool = True

    def __post_init__(self) -> None:
        for name in ("ca", "certfile", "keyfile"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value or "\0" in value):
                raise FencingConfigurationError(f"ZooKeeperTLS {name} must be a file path, got {value!r:.80}")
        if (self.certfile is None) != (self.keyfile is None):
            raise FencingConfigurationError("ZooKeeperTLS needs both certfile and keyfile, or neither")
        if not isinstance(self.verify_certs, bool):
            raise FencingConfigurationError(f"ZooKeeperTLS verify_certs must be a bool, got {self.verify_certs!r}")


def validate_digest(digest: object) -> tuple[str, str] | None:
    if digest is None:
        return None
    if (
        isinstance(digest, tuple)
        and len(digest) == 2
        and all(isinstance(part, str) and part and "\0" not in part for part in digest)
        and ":" not in digest[0]
    ):
        return digest[0], digest[1]
    # Never echo the value: it holds the password.
    raise FencingConfigurationError(
        "digest must be a (username, password) pair of non-empty str, the username without ':'"
    )


# What kazoo logs on every reconnect attempt: a worker logged ~130 of these in a
# 12 s outage. The first of an outage is shown; the rest go to DEBUG.
_RECONNECT_CHATTER = frozenset(
    {
        "Connecting to %s(%s):%s, use_ssl: %r",
        "Connection dropped: %s",
        "Connection time-out: %s",
        "Transition to CONNECTING",
        "Cannot resolve %s: %s",
        "Closing connection to %s:%s",
        "Zookeeper connection lost",
    }
)
_CONNECTED = "Zookeeper connection established, state: %s"
#: While ZooKeeper stays unreachable, one reminder this often (seconds).
OUTAGE_REMINDER = 60.0


class _MaskingLogger(logging.LoggerAdapter):  # type: ignore[type-arg]
    """kazoo's logger, with the ``auth`` of authentication packets masked and its reconnect chatter summarised.

    kazoo logs each request it sends at DEBUG ("Sending request(xid=-4):
    Auth(auth_type=0, scheme='digest', auth='user:password')"); this adapter
    is the ``logger=`` of the clients this package builds, so that record
    carries ``auth='***'`` instead.

    During an outage kazoo logs several lines per reconnect attempt. The
    first is passed on; the others go out at DEBUG; when the connection is
    back, one line says after how long and how many were held back (and while
    it is not, one reminder a minute). Everything else goes to kazoo's logger
    (``kazoo.client``) unchanged, so its configuration still applies.
    """

    def __init__(self, logger: logging.Logger, extra: Any) -> None:
        super().__init__(logger, extra)
        self._lock = threading.Lock()
        self._outage_since: float | None = None
        self._held_back = 0
        self._reminded_at = 0.0

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        masked = tuple(_mask(arg) for arg in args)
        if msg in _RECONNECT_CHATTER:
            level = self._quieted(level)
        elif msg == _CONNECTED:
            self._report_recovery()
        super().log(level, msg, *masked, **kwargs)

    def _quieted(self, level: int) -> int:
        now = time.monotonic()
        with self._lock:
            if self._outage_since is None:
                self._outage_since = self._reminded_at = now
                self._held_back = 0
                return level
            self._held_back += 1
            remind = now - self._reminded_at >= OUTAGE_REMINDER
            if remind:
                self._reminded_at = now
            since, held = self._outage_since, self._held_back
        if remind:
            super().log(
                logging.WARNING,
                "ZooKeeper still unreachable after %.0fs (%d reconnect messages at DEBUG)",
                now - since,
                held,
            )
        return min(level, logging.DEBUG)

    def _report_recovery(self) -> None:
        with self._lock:
            since, held = self._outage_since, self._held_back
            self._outage_since = None
            self._held_back = 0
        if since is not None and held:
            super().log(
                logging.WARNING,
                "ZooKeeper connection back after %.1fs (%d reconnect messages held back at DEBUG)",
                time.monotonic() - since,
                held,
            )

    def warn(self, msg: object, *args: object, **kwargs: Any) -> None:  # kazoo still calls warn()
        self.log(logging.WARNING, msg, *args, **kwargs)


def _mask(arg: object) -> object:
    if isinstance(arg, Auth):
        return arg._replace(auth="***")
    return arg


KAZOO_LOGGER = _MaskingLogger(logging.getLogger("kazoo.client"), {})


def client_options(digest: tuple[str, str] | None, tls: ZooKeeperTLS | None) -> dict[str, Any]:
    """``KazooClient`` keyword arguments for *digest* auth and ACL, *tls*, and the masking logger."""
    options: dict[str, Any] = {"logger": KAZOO_LOGGER}
    if digest is not None:
        user, password = digest
        options["auth_data"] = [("digest", f"{user}:{password}")]
        options["default_acl"] = [make_digest_acl(user, password, all=True)]
    if tls is not None:
        options.update(
            use_ssl=True,
            ca=tls.ca,
            certfile=tls.certfile,
            keyfile=tls.keyfile,
            verify_certs=tls.verify_certs,
        )
    return options


def _url_flag(name: str, raw: str, shown: str) -> bool:
    if raw.strip().lower() in _TRUE:
        return True
    if raw.strip().lower() in _FALSE:
        return False
    raise FencingConfigurationError(f"{name}={raw!r:.40} in {shown!r} must be true or false")


class UrlSettings(NamedTuple):
    """What a ``zookeeper://`` URL configures: the constructor's arguments."""

    hosts: str
    root: str
    digest: tuple[str, str] | None
    tls: ZooKeeperTLS | None
    seconds: dict[str, float]
    block: int


def parse_url(url: str) -> UrlSettings:
    """Check and split ``zookeeper://[user:password@]h1:2181,h2:2181/root?...`` (see ``from_url``).

    :raises FencingConfigurationError: naming what is wrong with *url* (the password shown as ``***``).
    """
    parts, shown = split_scheme_url(url, "zookeeper", "ZooKeeper URL")
    credentials, at, netloc = parts.netloc.rpartition("@")
    digest = None
    if at:
        user, colon, password = credentials.partition(":")
        if not colon or not user or not password:
            raise FencingConfigurationError(f"ZooKeeper URL {shown!r}: credentials must be user:password@")
        digest = validate_digest((unquote(user), unquote(password)))
    if not netloc:
        raise FencingConfigurationError(f"zookeeper:// URL {shown!r} names no host")
    if parts.fragment:
        raise FencingConfigurationError(f"zookeeper:// URL {shown!r} must not have a #fragment")
    hosts = validate_hosts(netloc, shown)
    path = unquote(parts.path)
    root = path if path not in ("", "/") else "/fencing"
    params = query_params(
        parts, {"timeout", "session_timeout", "block"} | _TLS_PARAMS, what="ZooKeeper URL", shown=shown
    )
    tls = _url_tls(params, shown)
    block = parse_block(shown, params.pop("block")) if "block" in params else DEFAULT_BLOCK_SIZE
    seconds = {name: parse_seconds(shown, name, raw) for name, raw in params.items() if name not in _TLS_PARAMS}
    try:
        root = validate_root(root)
    except FencingConfigurationError as exc:
        raise FencingConfigurationError(f"{exc} (in {shown!r})") from None
    return UrlSettings(hosts, root, digest, tls, seconds, block)


def _url_tls(params: dict[str, str], shown: str) -> ZooKeeperTLS | None:
    if not _TLS_PARAMS & set(params):
        return None
    if not _url_flag("tls", params.get("tls", "true"), shown):
        if set(params) & (_TLS_PARAMS - {"tls"}):
            raise FencingConfigurationError(f"TLS options in {shown!r} need tls=true")
        return None
    return ZooKeeperTLS(
        ca=params.get("ca") or None,
        certfile=params.get("certfile") or None,
        keyfile=params.get("keyfile") or None,
        verify_certs=_url_flag("verify_certs", params.get("verify_certs", "true"), shown),
    )
