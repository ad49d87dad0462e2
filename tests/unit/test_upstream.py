"""The upstream client's policies in-process, on answers the client's own interface carries (``UpstreamAnswer``;
no HTTP transport, no mocks of httpx): the one retry policy (which statuses, how often, how long) and the mapping
of upstream error answers to the mirror's exceptions, scrubbed of credentials."""

from __future__ import annotations

import json
from collections.abc import Mapping

import httpx
import pytest

from mirror import hf
from mirror.config import Settings
from mirror.errors import EntryNotFound, HubError, UpstreamUnavailable
from mirror.metrics import Metrics
from mirror.upstream import UpstreamAnswer, UpstreamClient, hub_error
from mirror.upstream import retry as retry_module
from mirror.upstream.retry import with_retries


def answer(status: int, headers: Mapping[str, str] | None = None, body: bytes = b"",
           reason: str = "") -> UpstreamAnswer:
    return UpstreamAnswer(status, httpx.Headers(dict(headers or {})), body, reason)


class Closing(UpstreamAnswer):
    """An answer that says when it was closed (a streamed one releases its connection there)."""

    closed = False

    async def aclose(self) -> None:
        object.__setattr__(self, "closed", True)


class Upstream:
    """Answers in order, counting the tries and the answers closed before a retry."""

    def __init__(self, *answers: UpstreamAnswer) -> None:
        self.answers = [Closing(a.status_code, a.headers, a.content, a.reason_phrase) for a in answers]
        self.given: list[Closing] = []
        self.tries = 0

    async def attempt(self) -> UpstreamAnswer:
        self.tries += 1
        self.given.append(self.answers.pop(0))
        return self.given[-1]


@pytest.fixture
def delays(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The backoffs the policy asked for, none waited."""
    asked: list[float] = []

    async def sleep(seconds: float) -> None:
        asked.append(seconds)

    monkeypatch.setattr(retry_module.asyncio, "sleep", sleep)
    return asked


# --- the retry policy -------------------------------------------------------------------------------------------------


async def test_a_5xx_is_retried_with_growing_backoff_until_an_answer(delays: list[float]) -> None:
    upstream = Upstream(answer(503), answer(502), answer(200, body=b"ok"))
    result = await with_retries(upstream.attempt, retries=3, backoff_max=10)
    assert result.status_code == 200 and upstream.tries == 3
    assert delays == [0.25, 0.5]


async def test_the_last_5xx_is_returned_when_the_retries_are_spent(delays: list[float]) -> None:
    upstream = Upstream(*(answer(500) for _ in range(3)))
    result = await with_retries(upstream.attempt, retries=2, backoff_max=10)
    assert result.status_code == 500 and upstream.tries == 3 and len(delays) == 2


async def test_a_4xx_other_than_429_is_not_retried(delays: list[float]) -> None:
    for status in (400, 401, 403, 404, 410):
        upstream = Upstream(answer(status))
        assert (await with_retries(upstream.attempt, retries=5, backoff_max=10)).status_code == status
        assert upstream.tries == 1
    assert delays == []


async def test_a_429_is_tried_once_more_at_most_then_relayed(delays: list[float]) -> None:
    upstream = Upstream(answer(429, {"Retry-After": "3"}), answer(429, {"Retry-After": "3"}), answer(200))
    result = await with_retries(upstream.attempt, retries=5, backoff_max=10)
    assert result.status_code == 429 and upstream.tries == 2
    assert delays == [3.0]  # Retry-After honoured


async def test_retry_after_is_capped_by_the_backoff_maximum(delays: list[float]) -> None:
    upstream = Upstream(answer(503, {"Retry-After": "3600"}), answer(200))
    await with_retries(upstream.attempt, retries=1, backoff_max=2.0)
    assert delays == [2.0]
    upstream = Upstream(*(answer(503) for _ in range(6)))
    await with_retries(upstream.attempt, retries=5, backoff_max=1.0)
    assert max(delays[1:]) == 1.0


async def test_every_answer_retried_is_closed_and_the_one_returned_is_not(delays: list[float]) -> None:
    upstream = Upstream(answer(503), answer(502), answer(200))
    result = await with_retries(upstream.attempt, retries=3, backoff_max=10)
    assert result.status_code == 200
    assert [a.closed for a in upstream.given] == [True, True, False]  # the caller reads and closes the last one


# --- error answers as the mirror's exceptions -------------------------------------------------------------------------


def test_a_5xx_is_upstream_unavailable() -> None:
    for status in (500, 502, 503, 504):
        error = hub_error(answer(status, reason="Bad Gateway"), resolve=True)
        assert isinstance(error, UpstreamUnavailable) and str(status) in error.message


def test_the_hubs_error_code_and_message_are_kept() -> None:
    error = hub_error(answer(401, {hf.H_ERROR_CODE: "GatedRepo", hf.H_ERROR_MESSAGE: "Access to model is restricted"}),
                      resolve=True)
    assert isinstance(error, HubError)
    assert (error.status, error.code, error.message) == (401, "GatedRepo", "Access to model is restricted")


def test_a_code_is_inferred_from_the_status_when_upstream_sends_none() -> None:
    commit = "c" * 40
    missing = hub_error(answer(404, {hf.H_REPO_COMMIT: commit}), resolve=True)
    assert isinstance(missing, EntryNotFound) and missing.commit == commit
    assert missing.headers == {hf.H_REPO_COMMIT: commit}
    repo = hub_error(answer(404), resolve=False)
    assert isinstance(repo, HubError) and not isinstance(repo, EntryNotFound) and repo.code == "RepoNotFound"
    assert hub_error(answer(401), resolve=True).code == "RepoNotFound"  # type: ignore[attr-defined]
    assert hub_error(answer(403), resolve=True).code == "GatedRepo"  # type: ignore[attr-defined]


def test_a_relayed_read_route_error_keeps_no_code() -> None:
    error = hub_error(answer(404, reason="Not Found"), resolve=False, infer=False)
    assert isinstance(error, HubError) and error.code is None and error.status == 404


def test_the_message_comes_from_the_json_error_else_the_reason() -> None:
    body = json.dumps({"error": ["first", "second"]}).encode()
    assert hub_error(answer(400, body=body), resolve=False).message == "first; second"
    assert hub_error(answer(400, body=b"<html>", reason="Bad Request"), resolve=False).message == "Bad Request"


def test_a_429_keeps_the_headers_that_tell_the_client_when_to_come_back() -> None:
    headers = {"Retry-After": "30", "RateLimit": '"api";r=0;t=30', "RateLimit-Policy": '"api";q=1000;w=300',
               "X-Other": "dropped"}
    error = hub_error(answer(429, headers), resolve=False)
    assert isinstance(error, HubError) and error.status == 429
    assert error.headers == {"Retry-After": "30", "RateLimit": '"api";r=0;t=30',
                             "RateLimit-Policy": '"api";q=1000;w=300'}


async def test_the_clients_errors_are_scrubbed_of_credentials(settings_env: pytest.MonkeyPatch) -> None:
    token = "hf_" + "s3cr3t" * 6
    client = UpstreamClient(Settings(upstream_token=token), Metrics())
    try:
        error = client.error(answer(400, {hf.H_ERROR_MESSAGE: f"bad token {token} in Authorization: Bearer {token}"}),
                             resolve=False)
    finally:
        await client.aclose()
    assert token not in error.message and token not in str(error)
