"""``python -m tests.support.hub_emulator --port P --cdn-port Q --workdir DIR``: the Hub and CDN hosts in one
process."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import uvicorn

from tests.support.hub_emulator.app import Emulator
from tests.support.hub_emulator.fixtures import Fixtures


async def serve(args: argparse.Namespace) -> None:
    fixtures = Fixtures(args.workdir, args.big_file_size, args.huge_file_size)
    app = Emulator(fixtures, url_ttl=args.url_ttl, page_size=args.page_size,
                   cdn_port=args.cdn_port, hub_port=args.port, viewer_port=args.viewer_port)
    servers = [uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                             access_log=False, lifespan="off"))
               for port in (args.port, args.cdn_port, *([args.viewer_port] if args.viewer_port else []))]
    await asyncio.gather(*(s.serve() for s in servers))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--cdn-port", type=int, required=True)
    parser.add_argument("--viewer-port", type=int, default=0, help="the dataset viewer's host (datasets-server)")
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--page-size", type=int, default=1000)
    parser.add_argument("--big-file-size", type=int, default=8 << 20)
    parser.add_argument("--huge-file-size", type=int, default=0, help="acme/huge-data huge.bin, generated (0: none)")
    parser.add_argument("--url-ttl", type=float, default=300.0)
    asyncio.run(serve(parser.parse_args()))


if __name__ == "__main__":
    main()
