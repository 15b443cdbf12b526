"""celery_fencing.urls: the one redactor, query parameters against an allow-list, and every caller using them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from celery_fencing.exceptions import FencingConfigurationError
from celery_fencing.urls import query_params, redact_url, split_url

PASSWORD = "s3cr3t-Pa55"

# URLs that urlsplit() refuses or misreads: the old operator-command redactor returned these whole.
MALFORMED = [
    f"redis://user:{PASSWORD}@[::1:6379/0",
    f"redis://user:{PASSWORD}@host:notaport/0",
    f"postgresql://user:{PASSWORD}@[bad/db",
    f"zookeeper://user:{PASSWORD}@h1:2181,h2:x/root",
    f"redis://:{PASSWORD}@host:6379/0",
]


@pytest.mark.parametrize("url", MALFORMED)
def test_redact_url_hides_the_password_of_a_malformed_url(url: str) -> None:
    """The password never comes back, however broken the rest of the URL is."""
    shown = redact_url(url)
    assert PASSWORD not in shown
    assert ":***@" in shown


@given(
    user=st.text(alphabet=st.characters(blacklist_characters=":@/?#"), max_size=8),
    password=st.text(alphabet=st.characters(blacklist_characters="@/?#"), min_size=6, max_size=16),
    hosts=st.sampled_from(["h:1", "[::1", "h1:2181,h2:x", "", "[::1]:6379"]),
    tail=st.sampled_from(["", "/0", "/db?x=1", "#frag", "/[?"]),
)
def test_redact_url_never_returns_the_password(user: str, password: str, hosts: str, tail: str) -> None:
    """For any credentials and any (broken) host part, the password is replaced."""
    url = f"redis://{user}:{password}@{hosts}{tail}"
    shown = redact_url(url)
    assert f":{password}@" not in shown
    assert shown.startswith(f"redis://{user}:***@")


def test_query_params_refuses_an_unknown_parameter_naming_what_is_accepted() -> None:
    """One line that names the unknown parameter and lists the allowed ones; the password stays hidden."""
    url = f"etcd://u:{PASSWORD}@h:2379/p?timeout=1&lease=5"
    with pytest.raises(FencingConfigurationError, match=r"unknown parameter\(s\) lease in .*etcd:// accepts timeout"):
        query_params(split_url(url), {"timeout"}, what="etcd URL", shown=redact_url(url))


def test_query_params_refuses_a_malformed_query_string() -> None:
    """A query string that is not name=value pairs is refused, not read loosely."""
    with pytest.raises(FencingConfigurationError, match="malformed query string in sqlite:// URL"):
        query_params(split_url("sqlite:///t.db?timeout"), {"timeout"}, what="sqlite:// URL", shown="sqlite:///t.db")
