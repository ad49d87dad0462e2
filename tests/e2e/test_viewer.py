"""Issue 20: the dataset viewer's host and the parquet conversion, through the mirror, with the real ``datasets``.

The emulator answers as the viewer's host on its own port (the mirror's ``viewer_upstream``); the client process maps
every ``datasets-server.*`` name to 127.0.0.1 (``socket.getaddrinfo``), so ``datasets`` reaches the mirror's viewer
host exactly as it would through an ``/etc/hosts`` entry. A load *used* the viewer's ``/info`` when
``get_exported_dataset_infos`` returned (the client accepted ``X-Revision``, ``partial``, ``pending``, ``failed``)
and the parquet builder never read a schema itself (``pq.read_schema``: the inference read).
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.support.hub_emulator.runner import EmulatorHandle, run_emulator
from tests.support.mirror_proc import MirrorProcess, run_client

DATASET = "acme/tiny-parquet"
BRANCH = "refs%2Fconvert%2Fparquet"

# Client code: the loopback name for datasets-server.*, and probes on the viewer call and on schema inference.
PRELUDE = """
import json, socket
_gai = socket.getaddrinfo
def _loopback(host, *args, **kwargs):
    if isinstance(host, str) and host.startswith("datasets-server."):
        host = "127.0.0.1"
    return _gai(host, *args, **kwargs)
socket.getaddrinfo = _loopback
import datasets
from datasets.utils import _dataset_viewer
import importlib
pqmod = importlib.import_module("datasets.packaged_modules.parquet.parquet")
probe = {"info_used": False, "schema_reads": 0}
_infos = _dataset_viewer.get_exported_dataset_infos
def _probe_infos(*args, **kwargs):
    out = _infos(*args, **kwargs)
    probe["info_used"] = True
    return out
_dataset_viewer.get_exported_dataset_infos = _probe_infos
_read_schema = pqmod.pq.read_schema
def _probe_schema(*args, **kwargs):
    probe["schema_reads"] += 1
    return _read_schema(*args, **kwargs)
pqmod.pq.read_schema = _probe_schema
"""

LOAD = PRELUDE + """
ds = datasets.load_dataset("acme/tiny-parquet", streaming=STREAMING)
rows = {split: [dict(r) for r in ds[split]] for split in ("train", "test")}
print(json.dumps({**probe, "ids": {s: [r["id"] for r in v] for s, v in rows.items()},
                  "first": rows["train"][0], "features": str(ds["train"].features)}))
"""


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> EmulatorHandle:
    with run_emulator(tmp_path_factory.mktemp("emu")) as emu:
        yield emu


def _mirror(emulator: EmulatorHandle, cache: Path, *extra: str, viewer: str | None = None,
            **env: str) -> MirrorProcess:
    return MirrorProcess(emulator.url, cache, *extra,
                         env={"HF_MIRROR_VIEWER_UPSTREAM": viewer or emulator.viewer_url, **env})


def _viewer_get(mirror: MirrorProcess, path: str, **kwargs: object) -> httpx.Response:
    return httpx.get(mirror.url + path, headers={"host": f"datasets-server.127.0.0.1:{mirror.port}"}, timeout=30,
                     **kwargs)


def _load(mirror: MirrorProcess, home: Path, *, streaming: bool) -> dict:
    return run_client(LOAD.replace("STREAMING", str(streaming)), mirror.url, home, timeout=180)  # type: ignore[return-value]


def _expected_rows(emulator: EmulatorHandle) -> tuple[list[int], list[int]]:
    return (list(range(emulator.files.row_count(DATASET, "train"))),
            list(range(emulator.files.row_count(DATASET, "test"))))


def _viewer_requests(emulator: EmulatorHandle) -> list[dict]:
    return [r for r in emulator.requests() if r["host"] == "viewer"]


def test_viewer_host_answers_caches_and_rewrites(emulator: EmulatorHandle, tmp_path: Path) -> None:
    main = emulator.files.commit("dataset", DATASET, "main")
    with _mirror(emulator, tmp_path / "cache") as mirror:
        emulator.reset_stats()
        first = _viewer_get(mirror, f"/info?dataset={DATASET}")
        again = _viewer_get(mirror, f"/info?dataset={DATASET}")
        assert first.status_code == again.status_code == 200
        assert first.headers["x-revision"] == again.headers["x-revision"] == main
        assert (first.headers["x-mirror-cache"], again.headers["x-mirror-cache"]) == ("miss", "hit")
        body = again.json()
        assert body["partial"] is False and body["pending"] == [] and body["failed"] == []
        assert body["dataset_info"]["default"]["splits"]["train"]["num_examples"] == 200
        assert len(_viewer_requests(emulator)) == 1  # the second answer came from the cache

        parquet = _viewer_get(mirror, f"/parquet?dataset={DATASET}&split=train").json()
        url = parquet["parquet_files"][0]["url"]
        assert url == f"{mirror.url}/datasets/{DATASET}/resolve/{BRANCH}/default/train/0000.parquet"
        assert httpx.get(url, follow_redirects=True).content == emulator.files.file_bytes(
            "dataset", DATASET, "refs/convert/parquet", "default/train/0000.parquet")
        for endpoint in ("splits", "size", "is-valid"):
            assert _viewer_get(mirror, f"/{endpoint}?dataset={DATASET}").status_code == 200

        emulator.reset_stats()
        # Anything else on the viewer's host: refused here, never relayed.
        for path in ("/rows?dataset=acme/tiny-parquet", "/api/models/acme/tiny-model", "/", "/healthz",
                     "/info?dataset=acme/tiny-parquet/../x", "/info"):
            assert _viewer_get(mirror, path).status_code in (400, 404, 422), path
        post = httpx.post(mirror.url + f"/info?dataset={DATASET}",
                          headers={"host": f"datasets-server.127.0.0.1:{mirror.port}"})
        assert post.status_code == 405
        assert emulator.requests() == []
        # A dataset the viewer does not know: its 404, not cached.
        assert _viewer_get(mirror, "/info?dataset=acme/tiny-jsonl").status_code == 404
        assert _viewer_get(mirror, "/info?dataset=acme/tiny-jsonl").status_code == 404
        assert len(_viewer_requests(emulator)) == 2
        # Junk query parameters neither reach upstream nor make new cache entries.
        emulator.reset_stats()
        assert _viewer_get(mirror, f"/info?dataset={DATASET}&junk=1&x=2").headers["x-mirror-cache"] == "hit"
        assert _viewer_requests(emulator) == []


def test_token_goes_to_viewer_and_service_token_is_not_lent(emulator: EmulatorHandle, tmp_path: Path) -> None:
    with _mirror(emulator, tmp_path / "cache", "--upstream-token", "hf_good_token") as mirror:
        emulator.reset_stats()
        assert _viewer_get(mirror, f"/info?dataset={DATASET}").status_code == 200
        assert _viewer_get(mirror, f"/splits?dataset={DATASET}").status_code == 200
        auths = {r["auth"] for r in _viewer_requests(emulator)}
        assert auths == {None}, auths  # anonymous callers: never the service token
        emulator.reset_stats()
        r = httpx.get(mirror.url + f"/size?dataset={DATASET}", timeout=30,
                      headers={"host": f"datasets-server.x:{mirror.port}", "authorization": "Bearer hf_denied_token"})
        assert r.status_code == 200
        assert {q["auth"] for q in _viewer_requests(emulator)} == {"Bearer hf_denied_token"}


@pytest.mark.parametrize("streaming", [True, False])
def test_load_dataset_uses_the_mirrors_info(emulator: EmulatorHandle, tmp_path: Path, streaming: bool) -> None:
    train, test = _expected_rows(emulator)
    with _mirror(emulator, tmp_path / "cache") as mirror:
        emulator.reset_stats()
        out = _load(mirror, tmp_path / "home", streaming=streaming)
        assert out["ids"] == {"train": train, "test": test}
        assert out["info_used"] is True and out["schema_reads"] == 0, out
        assert [r["path"] for r in _viewer_requests(emulator)] == [f"/info?dataset={DATASET.replace('/', '%2F')}"]
        assert "/info 200" in mirror.log()
    # The viewer off: the same rows, inferred by the client (a schema read), and a fast 404 from the mirror.
    with _mirror(emulator, tmp_path / "cache-off", viewer="off") as mirror:
        emulator.reset_stats()
        out = _load(mirror, tmp_path / "home-off", streaming=streaming)
        assert out["ids"] == {"train": train, "test": test}
        assert out["info_used"] is False and out["schema_reads"] >= 1, out
        assert _viewer_requests(emulator) == []
        assert "/info 404" in mirror.log()


def test_offline_info_from_the_cached_parquet_footers(emulator: EmulatorHandle, tmp_path: Path) -> None:
    """The viewer's answer never cached (its upstream off), the parquet files are: offline, the mirror builds /info
    from their footers (row counts, plain-value features), and datasets uses it instead of inferring."""
    train, test = _expected_rows(emulator)
    cache = tmp_path / "cache"
    with _mirror(emulator, cache, viewer="off") as mirror:
        first = _load(mirror, tmp_path / "home-first", streaming=False)
        assert first["info_used"] is False and first["ids"] == {"train": train, "test": test}
    with _mirror(emulator, cache, "--offline", viewer="off") as mirror:
        info = _viewer_get(mirror, f"/info?dataset={DATASET}")
        assert info.status_code == 200, info.text
        body = info.json()
        assert body["partial"] is False and body["pending"] == [] and body["failed"] == []
        splits = body["dataset_info"]["default"]["splits"]
        assert {k: v["num_examples"] for k, v in splits.items()} == {"train": len(train), "test": len(test)}
        assert len(info.headers["x-revision"]) == 40
        out = _load(mirror, tmp_path / "home-offline", streaming=True)
        assert out["info_used"] is True and out["schema_reads"] == 0, out
        assert out["ids"] == {"train": train, "test": test}


def test_viewer_stale_when_upstream_down_and_offline(tmp_path: Path) -> None:
    with run_emulator(tmp_path / "emu") as emulator:
        train, test = _expected_rows(emulator)
        cache = tmp_path / "cache"
        with _mirror(emulator, cache, "--revision-ttl", "0") as mirror:
            warm = _load(mirror, tmp_path / "home-warm", streaming=False)
            assert warm["info_used"] is True
            _viewer_get(mirror, f"/parquet?dataset={DATASET}")
            # The viewer alone down: its answers stale, the load still uses /info.
            emulator.set_faults(viewer_down=True)
            stale = _viewer_get(mirror, f"/info?dataset={DATASET}")
            assert stale.status_code == 200 and stale.headers["x-mirror-cache"] == "stale"
            out = _load(mirror, tmp_path / "home-vdown", streaming=True)
            assert out["info_used"] is True and out["schema_reads"] == 0
            assert out["ids"] == {"train": train, "test": test}
            emulator.clear_faults()
            # The whole Hub down (connections refused).
            emulator.stop()
            stale = _viewer_get(mirror, f"/info?dataset={DATASET}")
            assert stale.status_code == 200 and stale.headers["x-mirror-cache"] == "stale"
            out = _load(mirror, tmp_path / "home-down", streaming=True)
            assert out["info_used"] is True and out["ids"] == {"train": train, "test": test}
            emulator.start()
        emulator.stop()
        with _mirror(emulator, cache, "--offline") as mirror:
            hit = _viewer_get(mirror, f"/info?dataset={DATASET}")
            assert hit.status_code == 200 and hit.headers["x-mirror-cache"] == "hit"
            out = _load(mirror, tmp_path / "home-offline", streaming=False)
            assert out["info_used"] is True and out["schema_reads"] == 0
            assert out["ids"] == {"train": train, "test": test}
            # Nothing known: a fast 404.
            missing = _viewer_get(mirror, "/info?dataset=acme/never-seen")
            assert missing.status_code == 404 and missing.elapsed.total_seconds() < 1
            # The parquet listing, from the cache.
            assert _viewer_get(mirror, f"/parquet?dataset={DATASET}").status_code == 200


def test_conversion_branch_through_every_route(emulator: EmulatorHandle, tmp_path: Path) -> None:
    convert = emulator.files.commit("dataset", DATASET, "refs/convert/parquet")
    code = """
import json
from huggingface_hub import HfApi, hf_hub_download, HfFileSystem
api = HfApi()
refs = api.list_repo_refs("acme/tiny-parquet", repo_type="dataset")
info = api.dataset_info("acme/tiny-parquet", revision="refs/convert/parquet")
files = api.list_repo_files("acme/tiny-parquet", repo_type="dataset", revision="refs/convert/parquet")
paths = api.get_paths_info("acme/tiny-parquet", ["default/train/0000.parquet"], repo_type="dataset",
                           revision="refs/convert/parquet")
local = hf_hub_download("acme/tiny-parquet", "default/train/0000.parquet", repo_type="dataset",
                        revision="refs/convert/parquet")
fs = HfFileSystem()
listed = fs.ls("datasets/acme/tiny-parquet@refs%2Fconvert%2Fparquet/default/test", detail=False)
print(json.dumps({"converts": [(c.name, c.ref, c.target_commit) for c in refs.converts], "sha": info.sha,
                  "files": files, "paths": [p.path for p in paths], "size": len(open(local, "rb").read()),
                  "listed": listed}))
"""
    with _mirror(emulator, tmp_path / "cache") as mirror:
        out = run_client(code, mirror.url, tmp_path / "home")
        assert out["converts"] == [["parquet", "refs/convert/parquet", convert]]
        assert out["sha"] == convert
        assert sorted(out["files"]) == [".gitattributes", "default/test/0000.parquet", "default/train/0000.parquet"]
        assert out["paths"] == ["default/train/0000.parquet"]
        assert out["size"] == emulator.files.size("dataset", DATASET, convert, "default/train/0000.parquet")
        assert out["listed"] == [f"datasets/{DATASET}@refs%2Fconvert%2Fparquet/default/test/0000.parquet"]
        # The Hub's parquet routes: listing (URLs pointed at the mirror) and the redirect into the branch.
        listing = httpx.get(f"{mirror.url}/api/datasets/{DATASET}/parquet").json()
        assert listing["default"]["train"] == [f"{mirror.url}/api/datasets/{DATASET}/parquet/default/train/0.parquet"]
        redirect = httpx.get(listing["default"]["train"][0])
        assert redirect.status_code == 302
        assert redirect.headers["location"] == f"/datasets/{DATASET}/resolve/{BRANCH}/default/train/0000.parquet"
        assert httpx.get(listing["default"]["train"][0], follow_redirects=True).content == \
            emulator.files.file_bytes("dataset", DATASET, convert, "default/train/0000.parquet")
        assert httpx.get(f"{mirror.url}/api/models/acme/tiny-model/parquet").status_code == 404
    with _mirror(emulator, tmp_path / "cache", "--offline") as mirror:
        emulator.reset_stats()
        for path in ("", "/default", "/default/train"):
            assert httpx.get(f"{mirror.url}/api/datasets/{DATASET}/parquet{path}").status_code == 200, path
        redirect = httpx.get(f"{mirror.url}/api/datasets/{DATASET}/parquet/default/train/0.parquet")
        assert redirect.status_code == 302
        assert httpx.get(f"{mirror.url}/api/datasets/{DATASET}/parquet/default/train/0.parquet",
                         follow_redirects=True).content == emulator.files.file_bytes(
            "dataset", DATASET, convert, "default/train/0000.parquet")
        # The test split's redirect was never asked and its file never fetched: nothing to answer from.
        assert httpx.get(f"{mirror.url}/api/datasets/{DATASET}/parquet/default/test/0.parquet").status_code == 404
        assert emulator.requests() == []

