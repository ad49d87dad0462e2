"""Ranged reads of a file through a mirror's Xet CAS, as hf_xet makes them: a read token, a reconstruction of the
Range, then the byte ranges of its (virtual) xorbs, unframed back into the file's bytes. Used by the sparse-fill
tests and ``bench/ranges.py``."""

from __future__ import annotations

import httpx

CHUNK = 64 * 1024  # the mirror's virtual xorbs: 64 KiB chunks, each after an 8-byte header


def unframe(data: bytes) -> bytes:
    """A xorb range's file bytes: each chunk's 8-byte header (its lengths, u24 LE at 1 and 5) dropped."""
    out, position = bytearray(), 0
    while position < len(data):
        length = int.from_bytes(data[position + 1:position + 4], "little")
        out += data[position + 8:position + 8 + length]
        position += 8 + length
    return bytes(out)


class CasReader:
    """Ranged reads of one file (``repo_type``, ``repo_id``, its Xet hash) through the mirror at ``mirror_url``."""

    def __init__(self, mirror_url: str, repo_type: str, repo_id: str, commit: str, xet_hash: str,
                 timeout: float = 60.0) -> None:
        plural = {"model": "models", "dataset": "datasets", "space": "spaces"}[repo_type]
        answer = httpx.get(f"{mirror_url}/api/{plural}/{repo_id}/xet-read-token/{commit}", timeout=timeout)
        if answer.status_code != 200:
            raise RuntimeError(f"xet-read-token: HTTP {answer.status_code} {answer.text[:300]}")
        self.mirror_url, self.xet_hash, self.timeout = mirror_url, xet_hash, timeout
        self.auth = {"authorization": f"Bearer {answer.json()['accessToken']}"}

    def read(self, start: int, end: int) -> tuple[bytes, list[str]]:
        """The file's bytes ``start..end`` (inclusive), and each xorb answer's X-Mirror-Cache. The terms cover whole
        chunks: the bytes before ``start`` in the first (``offset_into_first_range``) and past ``end`` in the last
        are cut, as hf_xet cuts them."""
        answer = httpx.get(f"{self.mirror_url}/_xet/v2/reconstructions/{self.xet_hash}",
                           headers={**self.auth, "range": f"bytes={start}-{end}"}, timeout=self.timeout)
        if answer.status_code != 200:
            raise RuntimeError(f"reconstruction: HTTP {answer.status_code} {answer.text[:300]}")
        plan = answer.json()
        data, outcomes = bytearray(), []
        for term in plan["terms"]:
            for fetch in plan["xorbs"][term["hash"]]:
                for span in fetch["ranges"]:
                    got = httpx.get(fetch["url"], timeout=self.timeout,
                                    headers={"range": f"bytes={span['bytes']['start']}-{span['bytes']['end']}"})
                    if got.status_code != 206:
                        raise RuntimeError(f"xorb range: HTTP {got.status_code} {got.text[:300]}")
                    data += unframe(got.content)
                    outcomes.append(got.headers["x-mirror-cache"])
        skip = plan["offset_into_first_range"]
        return bytes(data[skip:skip + end + 1 - start]), outcomes
