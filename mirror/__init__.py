"""hf-mirror: a self-hosted pull-through mirror of the Hugging Face Hub.

The house, in layers; a module imports only from its own layer or the ones above it in this list
(tests/unit/test_layers.py reads the import graph and holds every module to it):

    values and the wire contract  config, errors, hf, hubjson, routetable, layout (every path of the cache, named
                                  once), integrity, metrics, logs, asgi   (no I/O)
    adapters                      index (the one key schema), storage/ (local, s3/), metadata/ (embedded, postgres:
                                  leases, what a fleet shares, busy marks), upstream/ (the Hub client)
    policy                        access, admission/, auth, fill/, service/ (MirrorService delegating to its sides
                                  over one ServiceCore), viewer/, xet/   (no web framework, no HTTP)
    edges                         routes/, sync/, cache/, status/, audit/   (turn policy into bytes, runs, reports)
    the one wiring                parts (build_parts: every part from Settings), app (ASGI), front (a path prefix),
                                  server (uvicorn)
    the CLI                       cli/             (builds Settings, then the parts, and passes them down)

Beside the house, over HTTP only: harness/, demo/ (the demo and the sample Hub). docs/architecture.md follows one
cache miss through it.
"""

__version__ = "0.1.0"
