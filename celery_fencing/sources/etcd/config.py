"""Checking what an etcd source is given: endpoints, the key prefix, seconds, and the ``etcd://`` URL.

Nothing here talks to etcd. Every function raises
:class:`~celery_fencing.FencingConfigurationError` naming what is wrong (and
the URL it was found in).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote

from ...exceptions import FencingConfigurationError
from ...urls import parse_seconds, query_params, split_scheme_url

__all__ = ["parse_url", "validate_endpoints", "validate_prefix"]

_DEFAULT_PORT = 2379
_HOST_PORT = re.compile(r"^(?:\[(?P<ipv6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9_.-]+))(?::(?P<port>[0-9]{1,5}))?$")


def validate_endpoints(endpoints: object, url: str | None = None) -> tuple[str, ...]:
    where = f" in {url!r}" if url is not None else ""
    items: Sequence[object]
    if isinstance(endpoints, str):
        items = endpoints.split(",")
    elif isinstance(endpoints, Sequence):
        items = endpoints
    else:
        raise FencingConfigurationError(f"etcd endpoints must be 'host:port[,host:port...]'{where}, got {endpoints!r}")
    result = []
    for item in items:
        if not isinstance(item, str):
            raise FencingConfigurationError(f"malformed etcd endpoint {item!r}{where}: expected host:port")
        match = _HOST_PORT.match(item.strip())
        if match is None:
            raise FencingConfigurationError(f"malformed etcd endpoint {item!r}{where}: expected host:port")
        host = match.group("ipv6") or match.group("host")
        port = int(match.group("port") or _DEFAULT_PORT)
        if not 0 < port < 65536:
            raise FencingConfigurationError(f"etcd port {port} out of range{where}")
        result.append(f"[{host}]:{port}" if match.group("ipv6") else f"{host}:{port}")
    if not result:
        raise FencingConfigurationError(f"no etcd endpoint given{where}")
    return tuple(result)


def validate_prefix(prefix: object) -> str:
    if not isinstance(prefix, str) or not prefix.startswith("/") or prefix.rstrip("/") == "":
        raise FencingConfigurationError(f"etcd key prefix must look like '/fencing', got {prefix!r}")
    for char in prefix:
        if ord(char) < 0x20 or ord(char) == 0x7F:
            raise FencingConfigurationError(f"etcd key prefix {prefix!r} contains a control character")
    return prefix.rstrip("/")


def parse_url(url: str) -> dict[str, Any]:
    """The arguments of :class:`~celery_fencing.EtcdTokenSource` that *url* spells (see ``from_url``)."""
    parts, shown = split_scheme_url(url, "etcd", "etcd URL")
    if "@" in parts.netloc:
        raise FencingConfigurationError(f"credentials in the etcd URL are not supported: {shown!r}")
    if not parts.netloc:
        raise FencingConfigurationError(f"etcd:// URL {shown!r} names no host")
    if parts.fragment:
        raise FencingConfigurationError(f"etcd:// URL {shown!r} must not have a #fragment")
    endpoints = validate_endpoints(parts.netloc, url)
    path = unquote(parts.path)
    prefix = path if path not in ("", "/") else "/fencing"
    params = query_params(parts, {"timeout", "lease_ttl", "cluster_id"}, what="etcd URL", shown=shown)
    cluster_id = None
    raw_id = params.pop("cluster_id", None)
    if raw_id is not None:
        try:
            cluster_id = int(raw_id, 0)
        except ValueError:
            raise FencingConfigurationError(f"cluster_id={raw_id!r} in {shown!r} is not an integer") from None
    seconds = {name: parse_seconds(shown, name, raw) for name, raw in params.items()}
    try:
        prefix = validate_prefix(prefix)
    except FencingConfigurationError as exc:
        raise FencingConfigurationError(f"{exc} (in {shown!r})") from None
    return {"endpoints": endpoints, "prefix": prefix, "cluster_id": cluster_id, **seconds}
