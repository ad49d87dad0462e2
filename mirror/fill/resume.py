"""The one resume loop of every fill: a span of a file fetched from upstream until it is whole.

The single stream (the rest of a file) and each window of a parallel fill are a :class:`~mirror.fill.copy.Span`
fetched here: a stream that drops is asked again from the byte it reached, with a backoff while tries make no
progress, and a signed CDN URL that expired is resolved again (the Hub redirects to a fresh one, which every stream
of the fill then shares).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from mirror.errors import UpstreamUnavailable
from mirror.fill.copy import Span
from mirror.fill.state import FillSpec
from mirror.upstream import FileBody, UpstreamClient, UrlExpired

log = logging.getLogger("hf_mirror.fill")

MAX_ATTEMPTS_WITHOUT_PROGRESS = 6


def backoff(failures: int) -> float:
    """Seconds to wait before the next try after ``failures`` tries in a row without progress."""
    return min(0.2 * 2**failures, 5.0)


class SignedUrl:
    """The newest signed CDN URL of a file, shared by every stream of its fill; ``None``: ask the Hub (it redirects
    to a fresh one)."""

    def __init__(self, url: str | None) -> None:
        self.url = url

    def expired(self, used: str | None) -> None:
        """The CDN refused ``used``: resolve again, unless another stream already got a newer URL."""
        if self.url == used:
            self.url = None


async def fetch(upstream: UpstreamClient, spec: FillSpec, span: Span, url: SignedUrl,
                copy: Callable[[FileBody], Awaitable[None]]) -> None:
    """Fetch ``span`` of ``spec``'s file: open it from ``span.done`` and ``copy`` the body (which advances
    ``span.done``), again and again until the span is complete.

    Gives up after ``MAX_ATTEMPTS_WITHOUT_PROGRESS`` tries in a row that brought no byte (or kept meeting expired
    URLs). Anything but a drop (:class:`UpstreamUnavailable`) or an expired URL is raised at once.
    """
    failures = 0
    while not span.complete:
        before = span.done
        used = url.url
        try:
            async with upstream.open_file(spec.repo, spec.commit, spec.path, spec.token, start=span.done,
                                          end=span.end if span.bounded else None, cdn_url=used) as file:
                if file.cdn_url is not None:
                    url.url = file.cdn_url
                await copy(file)
            if not span.complete:
                raise UpstreamUnavailable(span.cut_short())
        except UrlExpired:
            log.info("signed URL for %s expired; resolving again", spec.path)
            url.expired(used)
            failures += 1
        except UpstreamUnavailable as exc:
            failures = 0 if span.done > before else failures + 1
            if failures >= MAX_ATTEMPTS_WITHOUT_PROGRESS:
                raise UpstreamUnavailable(f"giving up on {spec.path} after {failures} failed tries: {exc}") from exc
            log.info("%s of %s interrupted at %d/%d (%s); resuming", span, spec.path, span.done, span.end, exc)
            await asyncio.sleep(backoff(failures))
        if failures >= MAX_ATTEMPTS_WITHOUT_PROGRESS:
            raise UpstreamUnavailable(f"giving up on {spec.path}: signed URLs keep expiring")
