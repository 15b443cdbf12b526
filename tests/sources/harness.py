"""What the source contract suite needs from each kind of token source.

A harness builds sources from a URL (so child processes can build their own),
and knows how to restart its grantor and how to make it unreachable. Each kind
of source registers one fixture returning a SourceHarness.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from celery_fencing import TokenSource, token_source_from_url


@dataclass
class SourceHarness:
    name: str
    url: str
    #: Restart the grantor (server restart, file reopen, leader kill); None when it cannot.
    restart: Callable[[], None] | None = None
    #: Make the grantor unreachable; returns the URL a client should use while it is down.
    make_unavailable: Callable[[], str] | None = None
    #: Whether separate processes minting from the same URL share one counter.
    shared_across_processes: bool = True
    opened: list[TokenSource] = field(default_factory=list)

    def open(self, url: str | None = None) -> TokenSource:
        source = token_source_from_url(url or self.url)
        self.opened.append(source)
        return source

    def close_all(self) -> None:
        for source in self.opened:
            source.close()
        self.opened.clear()


def mint_many(url: str, resource: str, count: int) -> list[int]:
    """Child-process entry point: build a source from *url* and mint *count* tokens."""
    source = token_source_from_url(url)
    try:
        return [source.mint(resource, timeout=30).value for _ in range(count)]
    finally:
        source.close()
