"""Issue 20: the dataset viewer's host and the parquet conversion, through the mirror, with the real ``datasets``.

The emulator answers as the viewer's host on its own port (the mirror's ``viewer_upstream``); the client process maps
every ``datasets-server.*`` name to 127.0.0.1 (``socket.getaddrinfo``), so ``datasets`` reaches the mirror's viewer
host exactly as it would through an ``/etc/hosts`` entry. A load *used* the viewer's ``/info`` when
``get_exported_dataset_infos`` returned (the client accepted ``X-Revision``, ``partial``, ``pending``, ``failed``)
and the parquet builder never read a schema itself (``pq.read_schema``: the inference read).

The real-client loads run with ``datasets`` 5.x (the main venv) and 4.5 (``.venvs/datasets-4.5.0``, made on first use
by tests.support.client_venvs, about 30-40 s once). Read from their sources, 4.5 asks the viewer exactly what 5.x asks:
one ``GET /info?dataset=`` per load with the caller's token (``datasets/utils/_dataset_viewer.py`` is the same file),
under the same trigger (no ``data_files``/``data_dir``, revision None or ``main``; ``load.py``) and the same
acceptance rule; neither calls ``/parquet`` (``get_exported_parquet_files`` and
``HubDatasetModuleFactoryWithParquetExport`` exist but are never reached), nor ``/splits``, ``/size``, ``/is-valid``.
What differs is below the viewer: 4.5 also runs on huggingface_hub 0.x (requests) and passes ``proxies``; with the
huggingface_hub it resolves to (1.33, httpx) the requests are the same.

Private and gated datasets through the viewer host: the emulator answers as the viewer does (its auth check: 401
``ExternalUnauthenticatedError`` without a valid token, 404 ``ExternalAuthenticatedError`` with a token that may not
read); the mirror gives a cached answer only to a caller whose access upstream confirmed, and never lends its service
token for a caller's viewer request.
"""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest

from tests.support.client_venvs import datasets_venv
from tests.support.hub_emulator.fixtures import DENIED_TOKEN, GOOD_TOKEN
from tests.support.hub_emulator.runner import EmulatorHandle, run_emulator
from tests.support.mirror_proc import MirrorProcess, metric, run_client, wait_for

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
ds = datasets.load_dataset("DATASET", streaming=STREAMING)
rows = {split: [dict(r) for r in ds[split]] for split in ("train", "test")}
print(json.dumps({**probe, "ids": {s: [r["id"] for r in v] for s, v in rows.items()}, "version": datasets.__version__,
                  "first": rows["train"][0], "features": str(ds["train"].features)}))
"""

# The datasets generations the real-client loads run with: 5.x (the main venv) and 4.5 (its own venv).
GENERATIONS = ["5.x", "4.5"]
PROTECTED = ["acme/private-parquet", "acme/gated-parquet"]
BOGUS_TOKEN = "hf_bogus_token"


@pytest.fixture(params=GENERATIONS)
def client(request: pytest.FixtureRequest) -> tuple[str, str]:
    """(the generation, its python)."""
    return request.param, sys.executable if request.param == "5.x" else datasets_venv("4.5.0")


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> EmulatorHandle:
    with run_emulator(tmp_path_factory.mktemp("emu")) as emu:
        yield emu


def _mirror(emulator: EmulatorHandle, cache: Path, *extra: str, viewer: str | None = None,
            **env: str) -> MirrorProcess:
    return MirrorProcess(emulator.url, cache, *extra,
                         env={"HF_MIRROR_VIEWER_UPSTREAM": viewer or emulator.viewer_url, **env})


def _viewer_get(mirror: MirrorProcess, path: str, token: str | None = None, **kwargs: object) -> httpx.Response:
    headers = {"host": f"datasets-server.127.0.0.1:{mirror.port}"}
    if token:
        headers["authorization"] = f"Bearer {token}"
    return httpx.get(mirror.url + path, headers=headers, timeout=30, **kwargs)


def _load(mirror: MirrorProcess, home: Path, *, streaming: bool, client: tuple[str, str] = ("5.x", sys.executable),
          dataset: str = DATASET, **env: str) -> dict:
    generation, python = client
    out = run_client(LOAD.replace("STREAMING", str(streaming)).replace("DATASET", dataset), mirror.url, home,
                     python=python, timeout=180, **env)
    assert isinstance(out, dict) and out["version"].startswith("5." if generation == "5.x" else "4.5."), out
    return out


def _expected_rows(emulator: EmulatorHandle, dataset: str = DATASET) -> tuple[list[int], list[int]]:
    return (list(range(emulator.files.row_count(dataset, "train"))),
            list(range(emulator.files.row_count(dataset, "test"))))


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
def test_load_dataset_uses_the_mirrors_info(emulator: EmulatorHandle, tmp_path: Path, streaming: bool,
                                            client: tuple[str, str]) -> None:
    """Both generations: one /info (and no other viewer route), used (no schema inference), the rows right."""
    train, test = _expected_rows(emulator)
    with _mirror(emulator, tmp_path / "cache") as mirror:
        emulator.reset_stats()
        out = _load(mirror, tmp_path / "home", streaming=streaming, client=client)
        assert out["ids"] == {"train": train, "test": test}
        assert out["info_used"] is True and out["schema_reads"] == 0, out
        assert [r["path"] for r in _viewer_requests(emulator)] == [f"/info?dataset={DATASET.replace('/', '%2F')}"]
        wait_for(lambda: "/info 200" in mirror.log(), timeout=10)  # access lines are flushed every 0.2 s
    # The viewer off: the same rows, inferred by the client (a schema read), and a fast 404 from the mirror.
    with _mirror(emulator, tmp_path / "cache-off", viewer="off") as mirror:
        emulator.reset_stats()
        out = _load(mirror, tmp_path / "home-off", streaming=streaming, client=client)
        assert out["ids"] == {"train": train, "test": test}
        assert out["info_used"] is False and out["schema_reads"] >= 1, out
        assert _viewer_requests(emulator) == []
        wait_for(lambda: "/info 404" in mirror.log(), timeout=10)  # (flushed every 0.2 s)


def test_viewer_through_a_chain_of_mirrors_named_by_address(emulator: EmulatorHandle, tmp_path: Path) -> None:
    """A regional mirror B whose upstream is a central mirror A named by IP address (``http://127.0.0.1:PORT``),
    with no viewer setting: B's viewer host is ``datasets-server.127.0.0.1:PORT``, a name no resolver answers, so B
    connects to A's address with that name as the Host, and A answers it as its viewer host (from the emulator's
    viewer). The client's load used that /info."""
    train, test = _expected_rows(emulator)
    with _mirror(emulator, tmp_path / "cache-a") as central, \
            MirrorProcess(central.url, tmp_path / "cache-b") as regional:
        emulator.reset_stats()
        out = _load(regional, tmp_path / "home", streaming=False)
        assert out["ids"] == {"train": train, "test": test}
        assert out["info_used"] is True and out["schema_reads"] == 0, out
        # Asked once, at A's viewer host (its viewer route, not its Hub routes), which asked the emulator's viewer.
        assert [r["path"] for r in _viewer_requests(emulator)] == [f"/info?dataset={DATASET.replace('/', '%2F')}"]
        assert metric(central, "hf_mirror_requests_total", route="viewer", outcome="miss") == 1
        assert metric(regional, "hf_mirror_requests_total", route="viewer", outcome="miss") == 1
        # A's answer passed through B's rewriting: its URLs name B's hosts, neither A's nor the emulator's.
        parquet = _viewer_get(regional, f"/parquet?dataset={DATASET}&split=train")
        assert parquet.status_code == 200, parquet.text
        url = parquet.json()["parquet_files"][0]["url"]
        assert url == f"{regional.url}/datasets/{DATASET}/resolve/{BRANCH}/default/train/0000.parquet"
        assert metric(central, "hf_mirror_requests_total", route="viewer", outcome="miss") == 2


def test_offline_info_from_the_cached_parquet_footers(emulator: EmulatorHandle, tmp_path: Path,
                                                      client: tuple[str, str]) -> None:
    """The viewer's answer never cached (its upstream off), the parquet files are: offline, the mirror builds /info
    from their footers (row counts, plain-value features), and datasets uses it instead of inferring."""
    train, test = _expected_rows(emulator)
    cache = tmp_path / "cache"
    with _mirror(emulator, cache, viewer="off") as mirror:
        first = _load(mirror, tmp_path / "home-first", streaming=False, client=client)
        assert first["info_used"] is False and first["ids"] == {"train": train, "test": test}
    with _mirror(emulator, cache, "--offline", viewer="off") as mirror:
        info = _viewer_get(mirror, f"/info?dataset={DATASET}")
        assert info.status_code == 200, info.text
        body = info.json()
        assert body["partial"] is False and body["pending"] == [] and body["failed"] == []
        splits = body["dataset_info"]["default"]["splits"]
        assert {k: v["num_examples"] for k, v in splits.items()} == {"train": len(train), "test": len(test)}
        assert len(info.headers["x-revision"]) == 40
        out = _load(mirror, tmp_path / "home-offline", streaming=True, client=client)
        assert out["info_used"] is True and out["schema_reads"] == 0, out
        assert out["ids"] == {"train": train, "test": test}


def test_viewer_stale_when_upstream_down_and_offline(tmp_path: Path, client: tuple[str, str]) -> None:
    with run_emulator(tmp_path / "emu") as emulator:
        train, test = _expected_rows(emulator)
        cache = tmp_path / "cache"
        with _mirror(emulator, cache, "--revision-ttl", "0") as mirror:
            warm = _load(mirror, tmp_path / "home-warm", streaming=False, client=client)
            assert warm["info_used"] is True
            _viewer_get(mirror, f"/parquet?dataset={DATASET}")
            # The viewer alone down: its answers stale, the load still uses /info.
            emulator.set_faults(viewer_down=True)
            stale = _viewer_get(mirror, f"/info?dataset={DATASET}")
            assert stale.status_code == 200 and stale.headers["x-mirror-cache"] == "stale"
            out = _load(mirror, tmp_path / "home-vdown", streaming=True, client=client)
            assert out["info_used"] is True and out["schema_reads"] == 0
            assert out["ids"] == {"train": train, "test": test}
            emulator.clear_faults()
            # The whole Hub down (connections refused).
            emulator.stop()
            stale = _viewer_get(mirror, f"/info?dataset={DATASET}")
            assert stale.status_code == 200 and stale.headers["x-mirror-cache"] == "stale"
            out = _load(mirror, tmp_path / "home-down", streaming=True, client=client)
            assert out["info_used"] is True and out["ids"] == {"train": train, "test": test}
            emulator.start()
        emulator.stop()
        with _mirror(emulator, cache, "--offline") as mirror:
            hit = _viewer_get(mirror, f"/info?dataset={DATASET}")
            assert hit.status_code == 200 and hit.headers["x-mirror-cache"] == "hit"
            out = _load(mirror, tmp_path / "home-offline", streaming=False, client=client)
            assert out["info_used"] is True and out["schema_reads"] == 0
            assert out["ids"] == {"train": train, "test": test}
            # Nothing known: a fast 404.
            missing = _viewer_get(mirror, "/info?dataset=acme/never-seen")
            assert missing.status_code == 404  # offline: nothing asked upstream (the emulator is stopped)
            # The parquet listing, from the cache.
            assert _viewer_get(mirror, f"/parquet?dataset={DATASET}").status_code == 200


# A caller who may not read the dataset, and what the viewer (so the mirror) answers them.
DENIED = [(None, 401, "ExternalUnauthenticatedError"), (BOGUS_TOKEN, 401, "ExternalUnauthenticatedError"),
          (DENIED_TOKEN, 404, "ExternalAuthenticatedError")]


def _assert_refused(mirror: MirrorProcess, dataset: str, *, down: bool = False, offline: bool = False) -> None:
    """Every viewer route refuses the anonymous caller, a bogus token and a valid token without access: the viewer's
    401/404 (upstream down: those, or 503 when access cannot be confirmed; offline, a token the mirror cannot tell
    bogus from denied: 404 ``ExternalAuthenticatedError``), never a cached answer."""
    for token, status, code in DENIED:
        for endpoint in ("info", "splits", "parquet", "size", "is-valid"):
            r = _viewer_get(mirror, f"/{endpoint}?dataset={dataset}", token=token)
            if down and r.status_code >= 500:
                continue
            expected = (404, DENIED[-1][2]) if offline and token else (status, code)
            assert (r.status_code, r.headers.get("x-error-code")) == expected, (endpoint, token, r.text)
            assert "x-revision" not in r.headers and "dataset_info" not in r.text and "parquet_files" not in r.text


@pytest.mark.parametrize("ttl", ["300", "0"])
@pytest.mark.parametrize("dataset", PROTECTED)
def test_private_and_gated_viewer_answers_go_to_entitled_callers_only(tmp_path: Path, dataset: str,
                                                                      ttl: str) -> None:
    """Per-caller access as for the dataset's files: before and after an entitled caller's answers are cached, with
    the cache fresh (ttl 300: a Hub HEAD with the caller's token decides) or stale (ttl 0: upstream decides), upstream
    down and offline. The mirror runs with a service token that could read the dataset and never sends it for a
    caller: an anonymous caller would otherwise be answered."""
    with run_emulator(tmp_path / "emu") as emulator:
        main = emulator.files.commit("dataset", dataset, "main")
        cache = tmp_path / "cache"
        with _mirror(emulator, cache, "--upstream-token", GOOD_TOKEN, "--revision-ttl", ttl) as mirror:
            emulator.reset_stats()
            _assert_refused(mirror, dataset)
            auths = {r["auth"] for r in emulator.requests()}
            assert f"Bearer {GOOD_TOKEN}" not in auths, auths
            assert len(_viewer_requests(emulator)) == 15  # each refusal came from the viewer, never cached
            for endpoint in ("info", "splits", "parquet", "size", "is-valid"):
                ok = _viewer_get(mirror, f"/{endpoint}?dataset={dataset}", token=GOOD_TOKEN)
                assert ok.status_code == 200 and ok.headers["x-revision"] == main, (endpoint, ok.text)
            info = _viewer_get(mirror, f"/info?dataset={dataset}", token=GOOD_TOKEN)
            assert info.headers["x-mirror-cache"] == ("hit" if ttl == "300" else "miss")
            assert info.json()["dataset_info"]["default"]["splits"]["train"]["num_examples"] == \
                emulator.files.row_count(dataset, "train")
            # The entitled caller's answers are cached now: the others still get nothing of them.
            emulator.reset_stats()
            _assert_refused(mirror, dataset)
            auths = {r["auth"] for r in emulator.requests()}
            assert auths <= {None, f"Bearer {BOGUS_TOKEN}", f"Bearer {DENIED_TOKEN}"}, auths
            # Upstream down: the entitled caller gets the cached answers (stale or fresh), the others nothing.
            emulator.stop()
            _assert_refused(mirror, dataset, down=True)
            down = _viewer_get(mirror, f"/info?dataset={dataset}", token=GOOD_TOKEN)
            assert down.status_code == 200 and down.headers["x-revision"] == main
            assert down.headers["x-mirror-cache"] == ("hit" if ttl == "300" else "stale")
        with _mirror(emulator, cache, "--offline") as mirror:
            _assert_refused(mirror, dataset, offline=True)
            offline = _viewer_get(mirror, f"/info?dataset={dataset}", token=GOOD_TOKEN)
            assert offline.status_code == 200 and offline.headers["x-mirror-cache"] == "hit"
            assert offline.headers["x-revision"] == main


@pytest.mark.parametrize("dataset", PROTECTED)
def test_load_private_and_gated_datasets_with_a_token(emulator: EmulatorHandle, tmp_path: Path, dataset: str,
                                                      client: tuple[str, str]) -> None:
    """The real client with an entitled token: its token reaches the viewer through the mirror, the /info answer is
    used, the rows are right; without a token the same load is refused (the Hub's answer), and the viewer's cached
    answer did not make the dataset readable."""
    train, test = _expected_rows(emulator, dataset)
    with _mirror(emulator, tmp_path / "cache", "--upstream-token", GOOD_TOKEN) as mirror:
        emulator.reset_stats()
        out = _load(mirror, tmp_path / "home", streaming=True, client=client, dataset=dataset, HF_TOKEN=GOOD_TOKEN)
        assert out["ids"] == {"train": train, "test": test}
        assert out["info_used"] is True and out["schema_reads"] == 0, out
        assert [(r["path"], r["auth"]) for r in _viewer_requests(emulator)] == \
            [(f"/info?dataset={dataset.replace('/', '%2F')}", f"Bearer {GOOD_TOKEN}")]
        refused = ANON_LOAD.replace("DATASET", dataset)
        assert run_client(refused, mirror.url, tmp_path / "home-anon", python=client[1]) == {"refused": True}
        for token, status, code in DENIED:
            r = _viewer_get(mirror, f"/info?dataset={dataset}", token=token)
            assert (r.status_code, r.headers.get("x-error-code")) == (status, code)


ANON_LOAD = PRELUDE + """
try:
    datasets.load_dataset("DATASET", streaming=True)
    print(json.dumps({"refused": False}))
except datasets.exceptions.DatasetNotFoundError:
    print(json.dumps({"refused": True}))
"""


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

