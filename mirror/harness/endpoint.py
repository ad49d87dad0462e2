"""What the parent asks the measured endpoint over HTTP: a pre-flight check of the repos, and the mirror's
``hf_mirror_served_bytes_total`` before and after a pass."""

from __future__ import annotations

import json
import os

from prometheus_client.parser import text_string_to_metric_families

from mirror.harness.protocol import HarnessError


def _http_get(url: str, timeout: float = 10.0) -> tuple[int, str]:
    import httpx

    headers = {}
    if os.environ.get("HF_TOKEN"):
        headers["authorization"] = f"Bearer {os.environ['HF_TOKEN']}"
    response = httpx.get(url, timeout=timeout, headers=headers, follow_redirects=True)
    return response.status_code, response.text


def preflight(endpoint: str, dataset: str | None, tokenizer: str) -> None:
    """Fail fast, with a clear message, on an unreachable endpoint or an unknown dataset/tokenizer repo."""
    import httpx

    base = endpoint.rstrip("/")
    checks = [("model", tokenizer, "unknown_tokenizer")]
    if dataset is not None:
        checks.insert(0, ("dataset", dataset, "unknown_dataset"))
    for kind, repo, error_kind in checks:
        url = f"{base}/api/{kind}s/{repo}"
        try:
            status, _ = _http_get(url)
        except httpx.HTTPError as exc:
            raise HarnessError("unreachable_endpoint", f"cannot reach {endpoint}: {exc!r}") from exc
        if status in (401, 403, 404):
            raise HarnessError(error_kind, f"{kind} {repo!r} not found at {endpoint} (HTTP {status}; "
                                           "a gated or private repo needs HF_TOKEN)")
        if status >= 400:
            raise HarnessError("endpoint_error", f"{url} answered HTTP {status}")


# The mirror's metric families the harness reads (mirror/metrics.py): the one place to follow a rename.
# Each: the name since the metrics' renaming, then the previous release's (a mirror of an older version).
SERVED = ("hf_mirror_served_bytes", "hf_mirror_bytes_served")  # body bytes sent to clients
UPSTREAM_REQUESTS = ("hf_mirror_upstream_requests",)  # requests sent upstream (any status)
FETCHED = ("hf_mirror_upstream_bytes", "hf_mirror_bytes_fetched")  # body bytes fetched from upstream


def scrape_mirror(endpoint: str) -> dict[str, float] | None:
    """Sums of the mirror's counters the harness reads (``served``, ``upstream_requests``, ``upstream_bytes``), or
    None when the endpoint has no Prometheus /metrics (not a mirror). A family that is absent reads as 0."""
    try:
        status, text = _http_get(endpoint.rstrip("/") + "/metrics", timeout=5)
    except Exception:  # noqa: BLE001 - any failure means "no metrics"
        return None
    if status != 200:
        return None
    try:
        families = {f.name: f for f in text_string_to_metric_families(text)}
    except ValueError:
        return None  # not Prometheus text: not a mirror
    if not any(name in families for name in SERVED):
        return None

    def total(names: tuple[str, ...]) -> float:
        for name in names:
            family = families.get(name)
            if family is not None:
                return sum(s.value for s in family.samples if s.name == name + "_total")
        return 0.0

    return {"served": total(SERVED), "upstream_requests": total(UPSTREAM_REQUESTS), "upstream_bytes": total(FETCHED)}


def scrape_bytes_served(endpoint: str) -> float | None:
    """Sum of the mirror's bytes-served counter, or None when the endpoint is not a mirror."""
    figures = scrape_mirror(endpoint)
    return figures["served"] if figures else None


def sample_hub_stats(url: str) -> dict[str, float] | None:
    """The sample Hub's own counters (requests and body bytes, data and metadata; its CPU seconds ``cpu_s``); None
    if unreadable."""
    try:
        status, text = _http_get(url.rstrip("/") + "/_sample_hub/stats", timeout=5)
        return json.loads(text) if status == 200 else None
    except Exception:  # noqa: BLE001 - a missing figure, not a failed bench
        return None
