"""Xet on the mirror's own address (issue 17): the token route, the CAS, and the hints on resolve and tree answers.

The flow (what hf_xet does with it, read from huggingface_hub 2.4 / hf_xet 1.8 and xet-core's CAS spec):

1. A resolve ``HEAD``/``GET`` of an LFS file that upstream marks as Xet-backed carries upstream's ``X-Xet-Hash`` and
   ``Link: <{mirror}/api/{type}s/{repo}/xet-read-token/{commit}>; rel="xet-auth"``; tree and paths-info entries carry
   ``xetHash``. Nothing of upstream's Xet (its CAS, its token, its links) ever reaches a client.
2. ``GET /api/{type}s/{repo}/xet-read-token/{rev}``: after the very access check a resolve of that repo's content
   makes for this caller, the mirror's own signed token (:mod:`mirror.xet.tokens`), its expiry and the CAS URL
   ``{mirror}/_xet``, as headers and as the JSON body hf_xet's refresh reads.
3. ``GET {mirror}/_xet/v2/reconstructions/{xet_hash}`` (also ``/v1/...`` and the unprefixed form of hf_xet 1.2),
   ``Authorization: Bearer <token>``, ``Range`` windows, 416 past the end: terms over virtual xorbs of the file
   (:mod:`mirror.xet.xorb`) whose byte-range URLs are ``{mirror}/_xet/xorb/{hash}?p=<signed>``. A token reads only
   files of its own repo, by the Xet hash upstream gave them.
4. ``GET {mirror}/_xet/xorb/...`` with ``Range``: the file's bytes framed as uncompressed chunks, from the blob store
   or from the fill in progress (only the asked bytes are waited for; the fill runs on detached, once; the file's
   last byte waits for its verification, as on the plain path).

Uploads (``/v1/xorbs``, ``/v1/shards``, ``/v2/shards``, ``/v1/chunks``, any method but GET/HEAD) are refused;
``POST /v1/telemetry`` is accepted and dropped.

- :mod:`mirror.routes.xet.token`: the hints (1) and the token route (2);
- :mod:`mirror.routes.xet.cas`: the CAS (3, 4, uploads refused);
- :mod:`mirror.routes.xet.reader`: the file bytes a xorb range frames, from a cached blob, a fill or a relay.
"""
