"""A file as virtual xorbs, in the chunk format hf_xet reads; the reconstruction JSON (v1 and v2) over them.

The mirror stores a file's verified bytes, not the Hub's xorbs. It lays the file out as consecutive virtual xorbs of
``CHUNKS_PER_XORB`` chunks of ``CHUNK`` bytes (the last one shorter), each chunk serialised as the 8-byte Xet chunk
header (version 0, compressed length u24 LE, compression scheme 0 = none, uncompressed length u24 LE) followed by
the raw bytes (xet-core ``xorb_object/xorb_chunk_format.rs``; a chunk may hold at most 128 KiB). A reconstruction
term is one virtual xorb's chunk range; its byte-range URL (``fetch_info`` for v1, ``xorbs`` for v2) points at the
mirror's own xorb route, which frames the file's bytes on the fly.

A virtual xorb's hash is derived from the file's Xet hash and the xorb's index: stable for the same content, so
hf_xet's chunk cache stays coherent; it names nothing upstream.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

CHUNK = 64 * 1024
CHUNKS_PER_XORB = 256  # 16 MiB of file data per virtual xorb: one term, one ranged request of the client
XORB_DATA = CHUNK * CHUNKS_PER_XORB
HEADER = 8
FRAME = CHUNK + HEADER


def xorb_hash(file_hash: str, index: int) -> str:
    name = f"hf-mirror virtual xorb v1|{file_hash}|{CHUNK}|{CHUNKS_PER_XORB}|{index}"
    return hashlib.sha256(name.encode()).hexdigest()


def xorb_count(size: int) -> int:
    return (size + XORB_DATA - 1) // XORB_DATA


def xorb_data_range(size: int, index: int) -> tuple[int, int]:
    """The file bytes ``[start, end)`` of virtual xorb ``index``."""
    start = index * XORB_DATA
    return start, min(start + XORB_DATA, size)


def xorb_length(size: int, index: int) -> int:
    """Serialised bytes of virtual xorb ``index``."""
    start, end = xorb_data_range(size, index)
    n = end - start
    return n + HEADER * ((n + CHUNK - 1) // CHUNK)


def chunk_header(length: int) -> bytes:
    n = length.to_bytes(3, "little")
    return b"\x00" + n + b"\x00" + n


def file_span(size: int, index: int, first: int, last: int) -> tuple[int, int]:
    """The file bytes ``[start, end)`` behind serialised bytes ``first..last`` (inclusive) of xorb ``index``."""
    base, end = xorb_data_range(size, index)
    start = base + (first // FRAME) * CHUNK + max(first % FRAME - HEADER, 0)
    stop = base + (last // FRAME) * CHUNK + max(last % FRAME - HEADER + 1, 0)
    return min(start, end), min(stop, end)


def frame(size: int, index: int, first: int, last: int, data: bytes, data_start: int) -> bytes:
    """Serialised bytes ``first..last`` (inclusive) of xorb ``index``, from file bytes ``data`` at ``data_start``
    (which must cover :func:`file_span`)."""
    base, end = xorb_data_range(size, index)
    out = bytearray()
    position = first
    while position <= last:
        j, offset = divmod(position, FRAME)
        chunk_start = base + j * CHUNK
        chunk_len = min(CHUNK, end - chunk_start)
        piece_end = min(last, j * FRAME + HEADER + chunk_len - 1)  # inclusive, within this frame
        if offset < HEADER:
            header = chunk_header(chunk_len)
            take = min(HEADER, piece_end - j * FRAME + 1)
            out += header[offset:take]
            offset = HEADER
        data_from = chunk_start + offset - HEADER
        data_to = chunk_start + (piece_end - j * FRAME) - HEADER + 1
        if data_to > data_from:
            out += data[data_from - data_start:data_to - data_start]
        position = piece_end + 1
    return bytes(out)


def reconstruction(file_hash: str, size: int, start: int, end: int, url: Callable[[int], str],
                   version: int) -> dict[str, Any]:
    """The reconstruction of file bytes ``start..end`` (inclusive, within the file) as xet-core's
    ``QueryReconstructionResponse`` (v1) or ``QueryReconstructionResponseV2`` (v2). ``url(index)`` is the signed
    byte-range URL of virtual xorb ``index``."""
    terms: list[dict[str, Any]] = []
    fetch: dict[str, list[dict[str, Any]]] = {}
    if size == 0:
        return _response(0, terms, fetch, version)
    first_chunk, last_chunk = start // CHUNK, end // CHUNK
    for index in range(first_chunk // CHUNKS_PER_XORB, last_chunk // CHUNKS_PER_XORB + 1):
        base_chunk = index * CHUNKS_PER_XORB
        c0 = max(first_chunk, base_chunk) - base_chunk
        c1 = min(last_chunk + 1, base_chunk + CHUNKS_PER_XORB) - base_chunk  # exclusive
        data_start = (base_chunk + c0) * CHUNK
        data_end = min((base_chunk + c1) * CHUNK, size)
        byte_first = c0 * FRAME
        byte_last = (c1 - 1) * FRAME + HEADER + (data_end - (base_chunk + c1 - 1) * CHUNK) - 1
        digest = xorb_hash(file_hash, index)
        terms.append({"hash": digest, "unpacked_length": data_end - data_start, "range": {"start": c0, "end": c1}})
        link = url(index)
        if version == 1:
            fetch[digest] = [{"range": {"start": c0, "end": c1}, "url": link,
                              "url_range": {"start": byte_first, "end": byte_last}}]
        else:
            fetch[digest] = [{"url": link, "ranges": [{"chunks": {"start": c0, "end": c1},
                                                       "bytes": {"start": byte_first, "end": byte_last}}]}]
    return _response(start - first_chunk * CHUNK, terms, fetch, version)


def _response(offset: int, terms: list[dict[str, Any]], fetch: dict[str, Any], version: int) -> dict[str, Any]:
    key = "fetch_info" if version == 1 else "xorbs"
    return {"offset_into_first_range": offset, "terms": terms, key: fetch}
