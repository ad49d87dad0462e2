"""The cross-site guard's pure parts (issue 23, item 5): which Content-Types are JSON, and origins compared whole."""

from __future__ import annotations

import pytest

from mirror.errors import AccessDenied, UnsupportedMediaType
from mirror.routes.common import is_json_media_type, refuse_cross_site


@pytest.mark.parametrize("value", ["application/json", "Application/JSON", "application/json; charset=utf-8",
                                   "application/json ; charset=UTF-8 ", 'application/json; charset="a;b"'])
def test_json_media_types(value):
    assert is_json_media_type(value)


@pytest.mark.parametrize("value", [None, "", "text/plain; application/json", "text/plain;application/json",
                                   "application/json; text/plain", "application/json, text/plain",
                                   "application/jsonx", "application/x-www-form-urlencoded", "application/json;",
                                   "multipart/form-data; boundary=application/json"])
def test_other_media_types(value):
    assert not is_json_media_type(value)


def scope(origin: str | None, host: str = "mirror.example:8090", scheme: str = "http",
          forwarded_host: str | None = None) -> dict:
    headers = [(b"content-type", b"application/json"), (b"host", host.encode())]
    if origin is not None:
        headers.append((b"origin", origin.encode()))
    if forwarded_host is not None:
        headers.append((b"x-forwarded-host", forwarded_host.encode()))
    return {"headers": headers, "scheme": scheme}


@pytest.mark.parametrize("origin,host,scheme,forwarded", [
    (None, "mirror.example:8090", "http", None),
    ("http://mirror.example:8090", "mirror.example:8090", "http", None),
    ("http://MIRROR.example:8090", "mirror.example:8090", "http", None),
    ("http://mirror.example", "mirror.example:80", "http", None),
    ("https://mirror.example:443", "mirror.example", "https", None),
    ("https://mirror.example", "127.0.0.1:8090", "https", "mirror.example"),  # behind a front
])
def test_same_origin_is_accepted(origin, host, scheme, forwarded):
    refuse_cross_site(scope(origin, host, scheme, forwarded))


@pytest.mark.parametrize("origin,host,scheme", [
    ("http://mirror.example:9999", "mirror.example:8090", "http"),  # another port: another site's page
    ("http://mirror.example", "mirror.example:8090", "http"),
    ("https://mirror.example:8090", "mirror.example:8090", "http"),  # another scheme
    ("http://evil.example:8090", "mirror.example:8090", "http"),
    ("null", "mirror.example:8090", "http"),
    ("http://mirror.example:notaport", "mirror.example:8090", "http"),
])
def test_other_origins_are_refused(origin, host, scheme):
    with pytest.raises(AccessDenied) as refused:
        refuse_cross_site(scope(origin, host, scheme))
    assert refused.value.status == 403 and refused.value.code == "CrossSiteRequest"


def test_a_type_sent_without_preflight_is_refused():
    request = scope(None)
    request["headers"][0] = (b"content-type", b"text/plain; application/json")
    with pytest.raises(UnsupportedMediaType):
        refuse_cross_site(request)
