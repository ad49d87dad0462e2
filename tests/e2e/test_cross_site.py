"""Cross-site requests (issue 23, item 5): the mirror's actions take ``application/json`` only (a type a browser
sends only after a preflight, which they never grant) from the mirror's own origin, compared whole (scheme, host,
port); and with ``--lend-upstream-token`` no page on another origin may read what the service token unlocked."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.support.hub_emulator.fixtures import GOOD_TOKEN
from tests.support.hub_emulator.runner import EmulatorHandle, run_emulator
from tests.support.mirror_proc import MirrorProcess

PIN = "/api/mirror/repos/model/acme/tiny-model/pin"
CONFIG = "/acme/tiny-model/resolve/main/config.json"


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorHandle]:
    with run_emulator(tmp_path_factory.mktemp("emu")) as handle:
        yield handle


def test_actions_take_json_only_from_the_mirrors_own_origin(emu, tmp_path):
    with MirrorProcess(emu.url, tmp_path / "cache") as mirror, httpx.Client(base_url=mirror.url, timeout=30) as http:
        assert http.get(CONFIG).status_code == 200
        other_port = f"http://127.0.0.1:{mirror.port + 1}"
        for origin in (other_port, "http://127.0.0.1", f"https://127.0.0.1:{mirror.port}", "null"):
            refused = http.post(PIN, json={}, headers={"origin": origin})
            assert refused.status_code == 403, (origin, refused.text)
            assert refused.headers["x-error-code"] == "CrossSiteRequest" and refused.json()["error"]
        # What a page sends without a preflight: text/plain (whatever follows it), from its own origin.
        for content_type in ("text/plain; application/json", "text/plain;application/json"):
            trick = http.post(PIN, content=b"{}", headers={"content-type": content_type, "origin": other_port})
            assert trick.status_code == 403 and trick.headers["x-error-code"] == "CrossSiteRequest", trick.text
            bare = http.post(PIN, content=b"{}", headers={"content-type": content_type})
            assert bare.status_code == 415, bare.text
        warm = http.post("/api/mirror/warm", content=b'{"repo": "acme/tiny-model"}',
                         headers={"content-type": "text/plain; application/json", "origin": other_port})
        assert warm.status_code == 403 and warm.headers["x-error-code"] == "CrossSiteRequest"
        assert http.get("/api/mirror/status").json()["repos"][0]["pinned"] is False

        for origin in (mirror.url, mirror.url.upper().replace("HTTP://", "http://")):
            same = http.post(PIN, content=b"{}", headers={"content-type": "application/json; charset=utf-8",
                                                          "origin": origin})
            assert same.status_code == 200 and same.json()["pinned"] is True, same.text
        assert http.get("/api/mirror/status").json()["repos"][0]["pinned"] is True


def test_what_the_lent_token_unlocks_is_not_granted_to_other_origins(emu, tmp_path):
    """With --lend-upstream-token, a private or gated file read through the service token carries no CORS grant (a
    page on another origin cannot read it through an intranet user's browser); public files and JSON keep ``*``."""
    page = {"origin": "http://evil.example:8000"}
    lending = ("--upstream-token", GOOD_TOKEN, "--lend-upstream-token")
    with MirrorProcess(emu.url, tmp_path / "cache", *lending) as mirror, \
            httpx.Client(base_url=mirror.url, timeout=30) as http:
        for _ in range(2):  # cold (from upstream), then cached
            for path in ("/acme/private-model/resolve/main/config.json",
                         "/acme/gated-model/resolve/main/model.safetensors", "/api/models/acme/private-model",
                         "/api/models/acme/gated-model"):  # (the emulator refuses a gated repo's info anonymously)
                for method in ("GET", "HEAD"):
                    lent = http.request(method, path, headers=page)
                    assert lent.status_code == 200, (path, lent.text)  # the lent token reads it, as before
                    assert "access-control-allow-origin" not in lent.headers, (method, path, lent.headers)
            public = http.get(CONFIG, headers=page)
            assert public.status_code == 200 and public.headers["access-control-allow-origin"] == "*"
            assert "x-repo-commit" in public.headers["access-control-expose-headers"].lower()
            info = http.get("/api/models/acme/tiny-model", headers=page)
            assert info.status_code == 200 and info.headers["access-control-allow-origin"] == "*"
            missing = http.get("/acme/tiny-model/resolve/main/no-such-file.bin", headers=page)
            assert missing.status_code == 404 and missing.headers["access-control-allow-origin"] == "*"
        # A caller's own token is theirs to use from any page: its answers keep the grant.
        own = http.get("/acme/private-model/resolve/main/config.json",
                       headers={**page, "authorization": f"Bearer {GOOD_TOKEN}"})
        assert own.status_code == 200 and own.headers["access-control-allow-origin"] == "*"
