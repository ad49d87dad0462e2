"""``hf-mirror serve``: run the mirror server. It has no flags of its own: the settings flags are its contract."""

from __future__ import annotations

import argparse

from mirror.config import Settings

HELP = "run the mirror server"


def run(args: argparse.Namespace, settings: Settings) -> int:
    # Only ``serve`` loads the server stack (uvicorn, FastAPI: about 0.5 s to import); ``cache`` and ``sync`` do not.
    from mirror.server import serve

    serve(settings)
    return 0
