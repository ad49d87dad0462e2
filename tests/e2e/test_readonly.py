"""Read-only and closed by default (issue 15): the mirror never changes upstream, never lends its service token,
never opens private bytes, and never leaks a credential.

Real mirror processes in front of the Hub emulator, which records every request it receives (host, method, raw path
with query, ``Authorization``): each test asserts the answer the caller got *and* what did or did not reach upstream.

Mirrors (module-scoped, one process each):

- ``deny_mirror``: no service token, ``--deny-repos model:acme/private-*`` (writes, paths, case, 429, index growth);
- ``service_mirror``: a service token, given by ``--upstream-token`` or (ignored, as it must be) by ``HF_TOKEN``;
- ``guarded``: mirror-side tokens plus a service token (status pages, scrubbed upstream errors);
- per test: the opt-in lending mirror, offline mirrors on a warmed cache, a mirror whose ``--upstream`` has a password.
"""

from __future__ import annotations

import re
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.hub_emulator.fixtures import DENIED_TOKEN, GOOD_TOKEN
from tests.support.hub_emulator.runner import EmulatorHandle
from tests.support.mirror_proc import MirrorProcess, free_port

GATED = "/acme/gated-model/resolve/main/model.safetensors"
PRIVATE = "/acme/private-model/resolve/main/config.json"
PRIVATE_API = "/api/models/acme/private-model"
PUBLIC = "/acme/tiny-model/resolve/main/config.json"
BOGUS_TOKEN = "hf_not_a_real_token"
MIRROR_TOKEN = "mt_team_a_secret_value"
ERROR_STATUSES = (401, 403, 404)
# The one POST the clients send to a read route.
PATHS_INFO = re.compile(r"^/api/(models|datasets|spaces)/[^/?]+(/[^/?]+)?/paths-info/[^/?]+(\?.*)?$")

Record = dict[str, Any]  # {"host": "hub"|"cdn", "method", "path", "auth"}, as EmulatorHandle.requests() gives


# --- helpers -----------------------------------------------------------------------------------------------------


def bearer(token: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"} if token else {}


def raw_request(port: int, target: str, method: str = "GET", extra: str = "") -> tuple[int, dict[str, str], bytes]:
    """Send a request line byte for byte (httpx would normalise the path): ``(status, headers, body)``."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(f"{method} {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{extra}\r\n".encode("latin-1"))
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1]) if lines[0].startswith("HTTP/") else 0
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return status, headers, body


def carrying(records: list[Record], token: str) -> list[Record]:
    """The recorded upstream requests whose ``Authorization`` holds ``token``."""
    return [r for r in records if r["auth"] and token in r["auth"]]


def assert_read_only(records: list[Record]) -> None:
    """Upstream only ever saw GET, HEAD, and POST to paths-info."""
    for r in records:
        assert r["method"] in ("GET", "HEAD") or (r["method"] == "POST" and PATHS_INFO.match(r["path"])), r


def assert_nothing_upstream(emulator: EmulatorHandle, what: object = "") -> None:
    records = emulator.requests()
    assert records == [], (what, records)


def assert_hub_error(response: httpx.Response, statuses: tuple[int, ...] = ERROR_STATUSES) -> None:
    """A refusal in the Hub's shape: an expected status, ``X-Error-Code``, and a JSON ``{"error": ...}`` body."""
    assert response.status_code in statuses, (response.request.method, response.url, response.status_code,
                                               response.text[:300])
    assert response.headers.get("x-error-code"), (response.url, dict(response.headers))
    if response.request.method != "HEAD":
        assert response.json().get("error"), (response.url, response.text[:300])


def blob(response: httpx.Response) -> bytes:
    """Status line, headers and body, for "does this appear anywhere in the answer" checks."""
    return f"{response.status_code} {response.headers}".encode("latin-1", "replace") + response.content


def no_secret_bytes(emulator: EmulatorHandle, response: httpx.Response) -> None:
    """Nothing of the gated/private repos' content (config.json's ``secret``, model bytes, API siblings)."""
    gated_tail = emulator.files.file_bytes("model", "acme/gated-model", "main", "model.safetensors")[-64:]
    assert b'"secret"' not in response.content and gated_tail not in response.content, response.url
    assert b'"siblings"' not in response.content, response.url


# --- mirrors -----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def deny_mirror(emulator: EmulatorHandle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MirrorProcess]:
    cache = tmp_path_factory.mktemp("deny") / "cache"
    with MirrorProcess(emulator.url, cache, "--deny-repos", "model:acme/private-*") as proc:
        yield proc


@pytest.fixture(scope="module", params=["--upstream-token", "HF_TOKEN"])
def service_mirror(request: pytest.FixtureRequest, emulator: EmulatorHandle,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[MirrorProcess]:
    """A mirror whose operator has a service token: given on the command line, or left in the environment."""
    root = tmp_path_factory.mktemp("service")
    if request.param == "--upstream-token":
        proc = MirrorProcess(emulator.url, root / "cache", "--upstream-token", GOOD_TOKEN)
    else:
        # MirrorProcess drops HF_TOKEN from the child's env; a wrapper puts it back, as an operator's shell would.
        wrapper = root / "python-with-hf-token"
        wrapper.write_text(f'#!/bin/sh\nHF_TOKEN={GOOD_TOKEN} exec "{sys.executable}" "$@"\n')
        wrapper.chmod(0o755)
        proc = MirrorProcess(emulator.url, root / "cache", env={"HF_TOKEN": GOOD_TOKEN}, python=str(wrapper))
    proc.token_source = request.param  # type: ignore[attr-defined]
    with proc:
        yield proc


@pytest.fixture(scope="module")
def guarded(emulator: EmulatorHandle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MirrorProcess]:
    """Mirror-auth mode with a service token, as in tests/e2e/test_security.py."""
    root = tmp_path_factory.mktemp("guarded")
    tokens = root / "tokens.toml"
    tokens.write_text(f'[[token]]\nname = "team-a"\ntoken = "{MIRROR_TOKEN}"\nrepos = ["model:acme/*"]\n')
    with MirrorProcess(emulator.url, root / "cache", "--auth-tokens-file", str(tokens),
                       "--upstream-token", GOOD_TOKEN) as proc:
        yield proc


@pytest.fixture(scope="module")
def warm_cache(emulator: EmulatorHandle, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache where an entitled caller fetched the gated file, the private file and the private API JSON online
    (a mirror without a service token); the mirror is stopped afterwards."""
    cache = tmp_path_factory.mktemp("offline") / "cache"
    with MirrorProcess(emulator.url, cache) as online, httpx.Client(base_url=online.url, timeout=30) as client:
        for path in (GATED, PRIVATE, PRIVATE_API):
            response = client.get(path, headers=bearer(GOOD_TOKEN))
            assert response.status_code == 200, (path, response.status_code, response.text[:300])
    return cache


# --- 1. read-only ------------------------------------------------------------------------------------------------

WRITES = [
    ("DELETE", "/api/models/acme/tiny-model/tag/v1"),
    ("DELETE", "/api/models/acme/tiny-model/branch/dev"),
    ("POST", "/api/repos/create"),
    ("PUT", "/api/models/acme/tiny-model/settings"),
    ("POST", "/api/spaces/acme/x/restart"),
    ("POST", "/api/models/acme/tiny-model/commit/main"),
    ("POST", "/api/models/acme/tiny-model/preupload/main"),
    ("DELETE", "/acme/tiny-model/resolve/main/config.json"),
    ("PUT", "/acme/tiny-model/resolve/main/config.json"),
    ("PATCH", "/api/models/acme/tiny-model"),
    ("DELETE", "/api/repos/delete"),
    ("POST", "/api/models/acme/tiny-model/tree/main"),  # POST to a read route other than paths-info
    ("PUT", "/api/models/acme/tiny-model/paths-info/main"),  # another method on the one POST route
    ("POST", "/api/models/acme/tiny-model"),
]


def check_writes_refused(emulator: EmulatorHandle, mirror: MirrorProcess, headers: dict[str, str]) -> None:
    """Every write in WRITES, and a cross-site form POST, is answered by the mirror and nothing reaches upstream."""
    json_body = {**headers, "content-type": "application/json"}
    # A cross-site HTML form is a "simple" request: a browser sends it without a preflight.
    form = {**headers, "content-type": "application/x-www-form-urlencoded", "origin": "https://evil.example",
            "referer": "https://evil.example/"}
    requests = [(method, path, json_body, b'{"name": "pwned", "type": "model", "private": false}')
                for method, path in WRITES]
    requests += [("POST", path, form, b"name=pwned&type=model&private=false")
                 for path in ("/api/repos/create", "/api/models/acme/tiny-model/settings")]
    with httpx.Client(base_url=mirror.url, timeout=30) as client:
        for method, path, request_headers, body in requests:
            emulator.reset_stats()
            response = client.request(method, path, headers=request_headers, content=body)
            assert_nothing_upstream(emulator, (method, path, headers))
            assert_hub_error(response, (403, 404, 405))
            if response.status_code == 405:
                allow = response.headers.get("allow", "")
                assert allow and method not in allow.upper().replace(" ", "").split(","), (method, path, allow)


def test_write_methods_are_answered_by_the_mirror(emulator, deny_mirror):
    for headers in ({}, bearer(GOOD_TOKEN)):  # whoever the caller is: anonymous or a Hub user with write rights
        check_writes_refused(emulator, deny_mirror, headers)
    # Reads still go upstream, and nothing else does: GET/HEAD, and POST only to paths-info.
    emulator.reset_stats()
    with httpx.Client(base_url=deny_mirror.url, timeout=30) as client:
        assert client.head("/datasets/acme/tiny-jsonl/resolve/main/train.jsonl").status_code == 200
        assert client.get("/datasets/acme/tiny-jsonl/resolve/main/train.jsonl").status_code == 200
        info = client.post("/api/datasets/acme/tiny-jsonl/paths-info/main", data={"paths": ["train.jsonl"]})
        assert info.status_code == 200 and [e["path"] for e in info.json()] == ["train.jsonl"]
    records = emulator.requests()
    assert_read_only(records)
    assert any(r["method"] == "POST" and PATHS_INFO.match(r["path"]) for r in records), records


def test_write_methods_never_reach_upstream_with_the_service_token(emulator, service_mirror):
    check_writes_refused(emulator, service_mirror, {})


def test_options_is_answered_locally(emulator, deny_mirror):
    emulator.reset_stats()
    with httpx.Client(base_url=deny_mirror.url, timeout=30) as client:
        for path in ("/", PUBLIC, "/api/models/acme/tiny-model", "/api/repos/create",
                     "/api/models/acme/tiny-model/tag/v1", "/api/models/acme/tiny-model/paths-info/main"):
            response = client.options(path, headers={"origin": "https://evil.example",
                                                     "access-control-request-method": "DELETE"})
            assert 200 <= response.status_code < 300, (path, response.status_code, response.text[:200])
            assert response.headers.get("access-control-allow-origin"), path
            assert response.headers.get("access-control-allow-methods"), path
    assert_nothing_upstream(emulator)


def test_whoami_and_write_tokens_never_get_the_service_token(emulator, service_mirror):
    emulator.reset_stats()
    with httpx.Client(base_url=service_mirror.url, timeout=30) as client:
        whoami = client.get("/api/whoami-v2")
        assert GOOD_TOKEN.encode() not in blob(whoami)
        # A GET that hands out a write credential is a write in disguise: never with the service token.
        client.get("/api/models/acme/tiny-model/xet-write-token/main")
    records = emulator.requests()
    assert not carrying(records, GOOD_TOKEN), records
    assert all(r["auth"] is None for r in records if "whoami" in r["path"]), records
    assert_read_only(records)


# --- 2. one canonical path ---------------------------------------------------------------------------------------

NON_CANONICAL = [
    "/api/../acme/private-model/resolve/main/config.json",
    "/api/../acme/private-model/resolve/main/model.safetensors",
    "/api/%2e%2e/acme/private-model/resolve/main/config.json",
    "/api/models//acme/tiny-model",
    "/api/models//acme/private-model",
    "/acme/tiny-model/resolve/main/./config.json",
    "/acme/tiny-model/resolve/main/a/../config.json",
    "/acme/tiny-model/resolve/main/%ff",
    "/api/models/acme/tiny-model/%ff",
    "/api/models/acme/tiny-model/tree/main/./sub",
    "/api/models/acme/tiny-model/some/unknown/route",
]


@pytest.mark.parametrize("target", NON_CANONICAL)
def test_non_canonical_paths_are_refused_before_upstream(emulator, deny_mirror, target):
    emulator.reset_stats()
    status, headers, body = raw_request(deny_mirror.port, target)
    assert_nothing_upstream(emulator, target)
    assert status in (400, 404), (target, status, body[:300])
    assert headers.get("x-error-code"), (target, headers)
    assert b'"secret"' not in body


# --- 3. case-insensitive deny ------------------------------------------------------------------------------------


def test_deny_list_ignores_case(emulator, deny_mirror):
    emulator.reset_stats()
    with httpx.Client(base_url=deny_mirror.url, timeout=30) as client:
        for path in ("/ACME/Private-Model/resolve/main/config.json", "/api/models/ACME/private-model",
                     "/acme/PRIVATE-MODEL/resolve/main/config.json", "/api/models/acme/Private-Model/tree/main",
                     PRIVATE, PRIVATE_API):
            for headers in ({}, bearer(GOOD_TOKEN)):
                response = client.get(path, headers=headers)
                assert_hub_error(response, (403,))
                assert b'"secret"' not in response.content
    assert_nothing_upstream(emulator)


def test_a_repo_reached_through_an_upstream_redirect_is_checked_again(emulator, deny_mirror):
    """A renamed repo: upstream answers 307 from the old id to the new one. The new id passes the lists again."""
    emulator.set_faults(renamed={"acme/old-private": "acme/private-model", "acme/old-tiny": "acme/tiny-model"})
    try:
        emulator.reset_stats()
        with httpx.Client(base_url=deny_mirror.url, timeout=30) as client:
            for path in ("/acme/old-private/resolve/main/config.json", "/api/models/acme/old-private"):
                response = client.get(path, headers=bearer(GOOD_TOKEN))
                assert_hub_error(response, (403,))
                assert b'"secret"' not in response.content
            # Upstream was asked for the old id only: the redirect to the denied repo was not followed.
            assert emulator.requests() and all("old-private" in r["path"] for r in emulator.requests())
            moved = client.get("/acme/old-tiny/resolve/main/config.json")
            assert moved.status_code == 200
            assert moved.content == emulator.files.file_bytes("model", "acme/tiny-model", "main", "config.json")
    finally:
        emulator.clear_faults()


# --- 4. the service token is not lent by default -----------------------------------------------------------------


def test_service_token_is_not_lent_to_callers(emulator, service_mirror):
    from_env = service_mirror.token_source == "HF_TOKEN"
    gated_bytes = emulator.files.file_bytes("model", "acme/gated-model", "main", "model.safetensors")
    with httpx.Client(base_url=service_mirror.url, timeout=30) as client:

        def refused_to_anonymous_and_denied() -> None:
            emulator.reset_stats()
            anon = client.get(GATED)
            assert_hub_error(anon, (401,))
            assert anon.headers["x-error-code"] == "GatedRepo"
            denied = client.get(GATED, headers=bearer(DENIED_TOKEN))
            assert_hub_error(denied, (403,))
            assert denied.headers["x-error-code"] == "GatedRepo"
            privates = [client.get(PRIVATE, headers=headers) for headers in ({}, bearer(DENIED_TOKEN))]
            for response in privates:
                assert_hub_error(response, (401, 404))
            for response in (anon, denied, *privates):
                no_secret_bytes(emulator, response)
            records = emulator.requests()
            assert not carrying(records, GOOD_TOKEN), records
            assert_read_only(records)

        refused_to_anonymous_and_denied()  # cold
        emulator.reset_stats()
        good = client.get(GATED, headers=bearer(GOOD_TOKEN))
        assert good.status_code == 200 and good.content == gated_bytes
        assert client.get(PRIVATE, headers=bearer(GOOD_TOKEN)).status_code == 200
        assert carrying(emulator.requests(), GOOD_TOKEN)  # the entitled caller's own token went upstream
        refused_to_anonymous_and_denied()  # now cached: still refused, and no access check borrows the token

        emulator.reset_stats()
        public = client.get(PUBLIC)
        assert public.status_code == 200
        assert public.content == emulator.files.file_bytes("model", "acme/tiny-model", "main", "config.json")
        records = emulator.requests()
        assert_read_only(records)
        if from_env:  # ``serve`` never picks up HF_TOKEN: no request of this mirror's ever carries it
            assert not carrying(records, GOOD_TOKEN), records


def test_lending_the_service_token_is_an_explicit_opt_in(emulator, tmp_path):
    gated_bytes = emulator.files.file_bytes("model", "acme/gated-model", "main", "model.safetensors")
    with MirrorProcess(emulator.url, tmp_path / "cache", "--upstream-token", GOOD_TOKEN,
                       "--lend-upstream-token") as proc:
        emulator.reset_stats()
        response = httpx.get(proc.url + GATED, timeout=30)
        assert response.status_code == 200 and response.content == gated_bytes
        records = emulator.requests()
        assert carrying(records, GOOD_TOKEN), records
        assert_read_only(records)
        log = proc.flushed_log()
        assert GOOD_TOKEN not in log
        # The operator is told, at start, what the setting does.
        assert any("WARNING" in line and "lend" in line.lower() for line in log.splitlines()), log[-2000:]


# --- 5. offline stays closed -------------------------------------------------------------------------------------


def test_offline_serves_non_public_content_only_to_confirmed_callers(emulator, warm_cache):
    emulator.reset_stats()
    with MirrorProcess(emulator.url, warm_cache, "--offline") as proc, \
            httpx.Client(base_url=proc.url, timeout=30) as client:

        def refused() -> None:
            for token in (None, BOGUS_TOKEN, DENIED_TOKEN):
                for path in (GATED, PRIVATE, PRIVATE_API):
                    response = client.get(path, headers=bearer(token))
                    assert_hub_error(response)
                    no_secret_bytes(emulator, response)

        refused()
        good = client.get(GATED, headers=bearer(GOOD_TOKEN))
        assert good.status_code == 200
        assert good.content == emulator.files.file_bytes("model", "acme/gated-model", "main", "model.safetensors")
        private = client.get(PRIVATE, headers=bearer(GOOD_TOKEN))
        assert private.status_code == 200 and b'"secret"' in private.content
        api = client.get(PRIVATE_API, headers=bearer(GOOD_TOKEN))
        assert api.status_code == 200 and api.json()["id"] == "acme/private-model"
        refused()  # serving the entitled caller opened nothing for the others
    assert_nothing_upstream(emulator)


def test_offline_access_grace_zero_refuses_even_confirmed_callers(emulator, warm_cache):
    emulator.reset_stats()
    with MirrorProcess(emulator.url, warm_cache, "--offline", "--access-grace", "0") as proc, \
            httpx.Client(base_url=proc.url, timeout=30) as client:
        for token in (GOOD_TOKEN, None):
            for path in (GATED, PRIVATE, PRIVATE_API):
                response = client.get(path, headers=bearer(token))
                assert_hub_error(response)
                no_secret_bytes(emulator, response)
    assert_nothing_upstream(emulator)


# --- 6. mirror-auth mode: status pages need a token ---------------------------------------------------------------


def test_status_pages_need_a_mirror_token(emulator, guarded):
    with httpx.Client(base_url=guarded.url, timeout=30) as client:
        assert client.get(GATED, headers=bearer(MIRROR_TOKEN)).status_code == 200  # a repo name to list
        emulator.reset_stats()
        for path in ("/", "/metrics", "/api/mirror/status"):
            for headers in ({}, bearer("mt_wrong"), bearer(GOOD_TOKEN)):
                response = client.get(path, headers=headers)
                assert response.status_code == 401, (path, headers, response.status_code)
                assert b"gated-model" not in response.content, path
            assert client.get(path, headers=bearer(MIRROR_TOKEN)).status_code == 200, path
        assert client.get("/healthz").status_code == 200
    assert_nothing_upstream(emulator)


# --- 7. nothing leaks --------------------------------------------------------------------------------------------


def test_upstream_error_text_is_scrubbed(emulator, guarded):
    emulator.reset_stats()
    emulator.set_faults(echo_auth_in_error=True)
    try:
        with httpx.Client(base_url=guarded.url, timeout=30, headers=bearer(MIRROR_TOKEN)) as client:
            responses = [client.request(method, path) for method, path in [
                ("GET", "/acme/tiny-model/resolve/main/README.md"),
                ("HEAD", "/acme/tiny-model/resolve/main/sub/nested.txt"),
                ("GET", "/acme/gated-model/resolve/main/config.json"),
                ("GET", "/api/models/acme/tiny-model/tree/main"),
                ("GET", "/api/models/acme/gated-model"),
                ("POST", "/api/models/acme/tiny-model/paths-info/main"),
            ]]
    finally:
        emulator.clear_faults()
    for response in responses:
        assert response.status_code >= 400, (response.url, response.status_code)
        assert b"hf_good_token" not in blob(response), (response.url, blob(response)[:500])
        assert b"session=abc" not in blob(response), (response.url, blob(response)[:500])
    records = emulator.requests()
    assert carrying(records, GOOD_TOKEN), records  # the echoing upstream did see the service token ...
    assert not carrying(records, MIRROR_TOKEN), records  # ... and never the mirror token
    assert_read_only(records)
    log = guarded.flushed_log()
    assert GOOD_TOKEN not in log and MIRROR_TOKEN not in log


def test_upstream_credentials_never_shown(emulator, tmp_path):
    closed = free_port()  # nothing listens there
    emulator.reset_stats()
    with MirrorProcess(f"http://user:s3cretpw@127.0.0.1:{closed}", tmp_path / "cache",
                       "--connect-timeout", "2") as proc, httpx.Client(base_url=proc.url, timeout=60) as client:
        for path in (PUBLIC, "/api/models/acme/tiny-model"):
            response = client.get(path)
            assert response.status_code in (502, 504), (path, response.status_code)
            assert b"s3cretpw" not in blob(response), path
        for path in ("/", "/api/mirror/status", "/metrics"):
            assert b"s3cretpw" not in blob(client.get(path)), path
        log = proc.flushed_log()
    assert "s3cretpw" not in log
    assert_nothing_upstream(emulator)  # and the emulator is not that upstream


CONTROL_CHARS = [
    "/acme/tiny-model/resolve/main/a%1b[31mred",
    "/acme/tiny-model/resolve/main/x%0d%0aFORGED%20line",
    "/acme/tiny-model/resolve/main/x%0aFORGED",
    "/api/models/acme/tiny-model/tree/main/%0d%0aFORGED",
    "/api/models/acme/tiny-model%1b/revision/main",
]


def test_control_characters_are_refused_and_never_logged_raw(emulator, deny_mirror):
    emulator.reset_stats()
    for target in CONTROL_CHARS:
        status, headers, body = raw_request(deny_mirror.port, target)
        assert status == 400, (target, status, body[:300])
        assert headers.get("x-error-code"), target
    assert_nothing_upstream(emulator)
    log = deny_mirror.flushed_log()
    assert "\x1b" not in log and "\r" not in log and "\nFORGED" not in log


# --- 8. 429 ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("method", "path"), [
    ("HEAD", "/gpt2/resolve/main/config.json"),
    ("GET", "/gpt2/resolve/main/config.json"),
    ("GET", "/api/models/gpt2"),
])
def test_429_is_relayed_after_at_most_one_retry(emulator, deny_mirror, method, path):
    emulator.reset_stats()
    emulator.set_faults(status_burst=5, burst_status=429, retry_after=1)
    try:
        response = httpx.request(method, deny_mirror.url + path, timeout=60)
    finally:
        emulator.clear_faults()
    assert response.status_code == 429, (method, path, response.status_code)
    assert response.headers.get("retry-after"), dict(response.headers)
    assert response.headers.get("ratelimit") == '"api";r=0;t=1', dict(response.headers)
    assert response.headers.get("ratelimit-policy") == '"fixed window";"api";q=1000;w=300', dict(response.headers)
    records = emulator.requests()
    assert 1 <= len(records) <= 2, records
    assert all(r["auth"] is None and "gpt2" in r["path"] for r in records), records
    assert_read_only(records)


# --- 9. index growth ---------------------------------------------------------------------------------------------


def test_unknown_query_parameters_are_not_part_of_the_key(emulator, deny_mirror):
    emulator.reset_stats()
    with httpx.Client(base_url=deny_mirror.url, timeout=30) as client:
        for query in ("junk=1", "junk=2", "other=x"):
            response = client.get(f"/api/models/acme/tiny-model?{query}")
            assert response.status_code == 200 and response.json()["id"] == "acme/tiny-model", query
    records = emulator.requests()
    info = [r for r in records if r["path"].split("?")[0] == "/api/models/acme/tiny-model"]
    assert len(info) == 1, records
    assert not [r for r in records if "junk" in r["path"] or "other" in r["path"]], records
    assert all(r["auth"] is None for r in records), records
    assert_read_only(records)
