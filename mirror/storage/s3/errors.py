"""What the bucket's failures become: :class:`StorageUnavailable` (a clear 503), never a bare client-library error."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import ParamSpec, TypeVar

import aiohttp
from botocore.exceptions import BotoCoreError, ClientError

from mirror.errors import StorageUnavailable

_P = ParamSpec("_P")
_T = TypeVar("_T")


def storage_errors(func: Callable[_P, Awaitable[_T]]) -> Callable[_P, Awaitable[_T]]:
    """Turn client-library failures into a MirrorError, so clients get a clear 503 instead of a bare 500."""

    @functools.wraps(func)
    async def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        try:
            return await func(*args, **kwargs)
        except ClientError as exc:
            raise StorageUnavailable(f"object store refused {func.__name__}: {error_code(exc)}") from exc
        except (BotoCoreError, aiohttp.ClientError) as exc:  # not OSError: a full local disk is no store outage
            raise StorageUnavailable(f"object store unreachable during {func.__name__}: {exc}") from exc

    return wrapper


def http_status(exc: ClientError) -> int:
    meta = exc.response.get("ResponseMetadata", {})
    status = int(meta.get("HTTPStatusCode", 0) or 0)
    if not status and error_code(exc) in ("404", "NoSuchKey", "NotFound"):
        return 404
    return status


def error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", "?"))
