"""What the parent asks the measured endpoint over HTTP: a pre-flight check of the repos, and the mirror's
``hf_mirror_served_bytes_total`` before and after a pass."""

from __future__ import annotations

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


def scrape_bytes_served(endpoint: str) -> float | None:
    """Sum of ``hf_mirror_served_bytes_total`` on the endpoint's /metrics, or None when it has none (not a mirror)."""
    try:
        status, text = _http_get(endpoint.rstrip("/") + "/metrics", timeout=5)
    except Exception:  # noqa: BLE001 - any failure means "no metrics"
        return None
    if status != 200:
        return None
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError:
        return None  # not Prometheus text: not a mirror
    # The name since the metrics' renaming first, then the previous release's (a mirror of an older version).
    for name in ("hf_mirror_served_bytes", "hf_mirror_bytes_served"):
        served = [f for f in families if f.name == name]
        if served:  # a mirror that has served nothing yet has the family without samples: 0
            return sum(s.value for s in served[0].samples if s.name == name + "_total")
    return None
