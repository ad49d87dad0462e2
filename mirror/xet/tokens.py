"""The mirror's own Xet credentials: signed (HMAC-SHA256), short-lived, scoped claims.

Two kinds, one format (``base64url(json claims) "." base64url(mac)``, with a ``kind`` inside the MAC):

- the **access token** the token route hands out (``X-Xet-Access-Token``): repo, commit, caller, expiry. hf_xet
  sends it as ``Authorization: Bearer`` to the CAS (:mod:`mirror.routes.xet`) for reconstructions;
- the **byte-range URL** of one virtual xorb of one file, listed in a reconstruction: hf_xet fetches it *without*
  ``Authorization`` (as it does presigned S3 URLs), so the URL carries its own grant: repo, file, blob, xorb index,
  expiry.

A fill of a cold gated or private file needs the caller's own Hub token upstream. The token route receives it, and
the CAS does not (hf_xet sends the Xet token only): so the caller's own token travels inside the claims, encrypted
(HMAC-SHA256 keystream, then the MAC over the whole). The service token is never put in a claim: a caller that reads
with the mirror's token (mirror-auth mode, or an explicit ``lend_upstream_token``) is marked ``svc`` and the CAS
uses the settings' token again.

The secret is the ``xet_signing_secret`` setting when one is given (the same on every node of a fleet: any node
accepts any node's tokens and unseals their caller tokens); otherwise, in a fleet (``metadata_url``), the one the
first node generated and stored in the fleet's database (:data:`FLEET_SECRET`, read by every node at start:
:meth:`XetSigner.open`); otherwise it is generated and kept in the cache directory (``xet-secret``, mode 0600),
shared by every worker of the node.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

FLEET_SECRET = "xet-signing-secret"  # its name among the fleet database's secrets
SECRET_BYTES = 32


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def load_secret(path: Path, configured: str | None = None) -> bytes:
    """The signing secret: the configured one, else the node's, read from ``path`` (``CacheLayout.xet_secret``),
    created (0600, atomically) on first use."""
    if configured:
        return configured.encode()
    try:
        data = path.read_bytes()
        if len(data) >= 32:
            return data
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, os.urandom(SECRET_BYTES))
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)  # the first worker wins; the others read its secret
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)
    return path.read_bytes()


class XetSigner:
    def __init__(self, secret: bytes | None = None, *,
                 load: Callable[[], Awaitable[bytes]] | None = None) -> None:
        """``secret``, or ``load``: where :meth:`open` reads it (the fleet's database), before the first request."""
        if secret is None and load is None:
            raise ValueError("a Xet signer needs a secret or a way to load one")
        self._load = load
        self._mac_key = self._enc_key = b""
        if secret is not None:
            self._key(secret)

    def _key(self, secret: bytes) -> None:
        self._mac_key = hmac.new(secret, b"hf-mirror xet mac", hashlib.sha256).digest()
        self._enc_key = hmac.new(secret, b"hf-mirror xet enc", hashlib.sha256).digest()

    async def open(self) -> None:
        """Read the secret from where ``load`` says (a no-op for a signer given its secret)."""
        if self._load is not None and not self._mac_key:
            self._key(await self._load())

    def _keys(self) -> tuple[bytes, bytes]:
        if not self._mac_key:
            raise RuntimeError("the Xet signer's secret was never loaded: await open() at start")
        return self._mac_key, self._enc_key

    # --- signed claims ---------------------------------------------------------------------------------------------

    def sign(self, kind: str, claims: dict[str, Any], ttl: float) -> tuple[str, int]:
        """A credential of ``kind`` for ``claims``, valid ``ttl`` seconds; returns (credential, expiry epoch)."""
        exp = int(time.time() + ttl)
        body = _b64(json.dumps({**claims, "exp": exp}, separators=(",", ":"), sort_keys=True).encode())
        return f"{body}.{self._mac(kind, body)}", exp

    def verify(self, kind: str, credential: str | None) -> dict[str, Any] | None:
        """The claims of a valid, unexpired credential of ``kind``; ``None`` otherwise."""
        if not credential or credential.count(".") != 1 or len(credential) > 8192:
            return None
        body, mac = credential.split(".")
        if not hmac.compare_digest(mac, self._mac(kind, body)):
            return None
        try:
            claims = json.loads(_unb64(body))
        except ValueError:
            return None
        if not isinstance(claims, dict) or not isinstance(claims.get("exp"), int) or claims["exp"] < time.time():
            return None
        return claims

    def _mac(self, kind: str, body: str) -> str:
        return _b64(hmac.new(self._keys()[0], f"{kind}\n{body}".encode(), hashlib.sha256).digest())

    # --- the caller's own token, sealed -------------------------------------------------------------------------------

    def seal(self, secret: str) -> str:
        """``secret`` encrypted for this node only (the MAC of the claims that carry it guards its integrity)."""
        nonce = os.urandom(16)
        data = secret.encode()
        return _b64(nonce + bytes(a ^ b for a, b in zip(data, self._keystream(nonce, len(data)), strict=True)))

    def unseal(self, sealed: str) -> str | None:
        try:
            raw = _unb64(sealed)
        except ValueError:
            return None
        nonce, data = raw[:16], raw[16:]
        if len(nonce) != 16:
            return None
        plain = bytes(a ^ b for a, b in zip(data, self._keystream(nonce, len(data)), strict=True))
        try:
            return plain.decode()
        except UnicodeDecodeError:
            return None

    def _keystream(self, nonce: bytes, length: int) -> bytes:
        out = bytearray()
        counter = 0
        while len(out) < length:
            out += hmac.new(self._keys()[1], nonce + counter.to_bytes(8, "big"), hashlib.sha256).digest()
            counter += 1
        return bytes(out[:length])
