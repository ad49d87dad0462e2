"""mirror.front: where the mirror is mounted, and whose ``X-Forwarded-Prefix`` it believes (in-process, no server).

The end-to-end side (the nginx front at /hf/ and every client through it) is tests/e2e/test_path_prefix.py."""

from __future__ import annotations

from typing import Any

import pytest

from mirror.config import ConfigError, Settings
from mirror.front import Front, wanted
from mirror.server import mounted_app


async def _app(scope: Any, receive: Any, send: Any) -> None:
    return None


def scope(path: str, *, client: str = "127.0.0.1", prefix: str | None = None) -> dict[str, Any]:
    headers = [(b"host", b"proxy")] + ([(b"x-forwarded-prefix", prefix.encode())] if prefix is not None else [])
    return {"type": "http", "path": path, "raw_path": path.encode(), "root_path": "", "client": (client, 5000),
            "headers": headers, "scheme": "http"}


def placed(front: Front, *args: Any, **kwargs: Any) -> tuple[str, str, bytes]:
    s = scope(*args, **kwargs)
    front.place(s)
    return s["root_path"], s["path"], s["raw_path"]


def test_root_path_is_stripped_when_carried_and_written_always() -> None:
    front = Front(_app, "/hf", ())
    assert placed(front, "/hf/api/models/a/b") == ("/hf", "/hf/api/models/a/b", b"/api/models/a/b")
    assert placed(front, "/hf") == ("/hf", "/hf/", b"/")
    # A front that strips it itself (or a probe on the port): served as is, URLs still under the mount path.
    assert placed(front, "/healthz") == ("/hf", "/hf/healthz", b"/healthz")
    # Only a whole segment is the prefix: /hfx/... is a repo "hfx/...", not the mount path.
    assert placed(front, "/hfx/model/resolve/main/a") == ("/hf", "/hf/hfx/model/resolve/main/a",
                                                          b"/hfx/model/resolve/main/a")


def test_the_raw_path_keeps_its_encoding() -> None:
    front = Front(_app, "/hf", ())
    s = scope("/hf/a/b/resolve/refs/pr/1/x")
    s["raw_path"] = b"/hf/a/b/resolve/refs%2Fpr%2F1/x"
    front.place(s)
    assert s["raw_path"] == b"/a/b/resolve/refs%2Fpr%2F1/x"


def test_forwarded_prefix_only_from_a_trusted_front() -> None:
    front = Front(_app, "", ("127.0.0.1", "10.0.0.0/8"))
    assert placed(front, "/api/x", prefix="/hf")[0] == "/hf"
    assert placed(front, "/api/x", client="10.2.3.4", prefix="/hf/")[0] == "/hf"
    assert placed(front, "/api/x", client="192.168.1.1", prefix="/evil")[0] == ""
    assert placed(front, "/api/x", prefix="/outer, /inner")[0] == "/outer"
    # Not a plain path: written nowhere (a front that forwards such a thing is misconfigured).
    for bad in ("/a//b", "/a/../b", "/a?b", "/a b", "/%2e%2e", "https://evil.example", "/" + "a" * 300):
        assert placed(front, "/api/x", prefix=bad)[0] == "", bad
    assert placed(front, "/api/x", prefix="//evil.example")[0] == "/evil.example"  # a path, never a network path
    assert Front(_app, "", ())._forwarded_prefix(scope("/api/x", prefix="/hf")) is None  # none trusted


def test_forwarded_prefix_and_root_path_compose() -> None:
    """X-Forwarded-Prefix is what the front cut; what is left may still carry the mount path."""
    front = Front(_app, "/hf", ("127.0.0.1",))
    assert placed(front, "/hf/api/x", prefix="/outer") == ("/outer/hf", "/outer/hf/api/x", b"/api/x")
    assert placed(front, "/api/x", prefix="/outer") == ("/outer", "/outer/api/x", b"/api/x")
    assert placed(front, "/api/x") == ("/hf", "/hf/api/x", b"/api/x")


@pytest.mark.parametrize("given,kept", [("", ""), ("/", ""), ("hf", "/hf"), ("/hf/", "/hf"), ("/a/b.c", "/a/b.c")])
def test_root_path_setting_is_normalised(settings_env: pytest.MonkeyPatch, given: str, kept: str) -> None:
    assert Settings(root_path=given).root_path == kept


@pytest.mark.parametrize("bad", ["/a/../b", "/a?x", "/a b", "/%2e"])
def test_root_path_setting_refuses_what_is_not_a_plain_path(settings_env: pytest.MonkeyPatch, bad: str) -> None:
    with pytest.raises(ConfigError):
        Settings(root_path=bad)


def test_no_layer_without_a_prefix_or_a_trusted_front(settings_env: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """The hot path is untouched unless configured: uvicorn runs the app itself."""
    plain = Settings(cache_dir=tmp_path)
    assert not wanted(plain) and not isinstance(mounted_app(plain), Front)
    assert isinstance(mounted_app(Settings(cache_dir=tmp_path, root_path="/hf")), Front)
    trusted = Settings(cache_dir=tmp_path, trusted_proxies="127.0.0.1, 10.0.0.0/8")
    assert trusted.trusted_proxies == ("127.0.0.1", "10.0.0.0/8") and isinstance(mounted_app(trusted), Front)
