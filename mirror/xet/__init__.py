"""Xet served by the mirror (issue 17): its own token route, its own CAS, byte ranges from its verified blobs.

- :mod:`mirror.xet.tokens`: the mirror's own signed, short-lived Xet tokens and byte-range URLs.
- :mod:`mirror.xet.catalog`: which upstream Xet hash names which file of which repo (learned from upstream only).
- :mod:`mirror.xet.finder`: a hash this node has not seen, found in upstream's listing of the token's commit.
- :mod:`mirror.xet.xorb`: the file laid out as virtual xorbs of uncompressed chunks; reconstruction JSON (v1, v2).

The web side is :mod:`mirror.routes.xet`. No HTTP client and no web framework here.
"""

from mirror.xet.catalog import XetCatalog, XetFile
from mirror.xet.tokens import XetSigner

CAS_PREFIX = "/_xet"  # the mirror's CAS lives under this path of the mirror's own address

__all__ = ["CAS_PREFIX", "XetCatalog", "XetFile", "XetSigner"]
