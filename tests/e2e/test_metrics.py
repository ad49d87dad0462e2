"""/metrics as Prometheus reads it: every worker counted under ``--workers 2``, names by Prometheus' conventions
(the old names beside them for one release), no ``_created`` series, and the series the monitoring assets in
deploy/monitoring/ query."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.parser import text_string_to_metric_families

from tests.support.hub_emulator.runner import EmulatorHandle, run_emulator
from tests.support.mirror_proc import REPO_ROOT, MirrorProcess, free_port, metric

FILE = "/acme/tiny-model/resolve/main/config.json"


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorHandle]:
    with run_emulator(tmp_path_factory.mktemp("emu")) as handle:
        yield handle


def scrape(mirror: MirrorProcess) -> dict[str, float]:
    """Every sample on one fresh connection's scrape, keyed ``name{k="v",...}`` (labels sorted)."""
    text = httpx.get(mirror.url + "/metrics", timeout=5, headers={"connection": "close"}).text
    return {sample.name + json.dumps(sample.labels, sort_keys=True): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def hits_by_process(files: Path) -> dict[str, float]:
    """Resolve hits each worker wrote into its own multiprocess file (``counter_<pid>.db``)."""
    counts: dict[str, float] = {}
    for db in files.glob("counter_*.db"):
        if db.stat().st_size < 8:  # a worker's file just made, not yet sized: nothing counted in it yet
            continue
        for key, value, _ts, _pos in MmapedDict.read_all_values_from_file(str(db)):
            _metric, sample, labels, _help = json.loads(key)
            if sample == "hf_mirror_requests_total" and labels == {"route": "resolve", "outcome": "hit"}:
                counts[db.stem] = counts.get(db.stem, 0.0) + value
    return counts


def test_two_workers_are_counted_on_every_scrape(emu, tmp_path):
    tmp = tmp_path / "tmp"  # where the server makes its per-run metrics directory (tempfile honours TMPDIR)
    tmp.mkdir()
    with MirrorProcess(emu.url, tmp_path / "cache", "--workers", "2", env={"TMPDIR": str(tmp)}) as mirror:
        assert httpx.get(mirror.url + FILE).headers["x-mirror-cache"] == "miss"
        (files,) = tmp.glob("hf-mirror-metrics-*")
        hits = 0
        # Each hit on a connection of its own, until both workers have answered some (the kernel picks which).
        while len(hits_by_process(files)) < 2 or hits < 14:
            assert hits < 400, hits_by_process(files)
            response = httpx.get(mirror.url + FILE, headers={"connection": "close"})
            assert response.headers["x-mirror-cache"] == "hit"
            hits += 1
        assert sum(hits_by_process(files).values()) == hits
        key = 'hf_mirror_requests_total{"outcome": "hit", "route": "resolve"}'
        scrapes = [scrape(mirror) for _ in range(8)]
        assert [s.get(key) for s in scrapes] == [hits] * 8
        assert {s['hf_mirror_requests_total{"outcome": "miss", "route": "resolve"}'] for s in scrapes} == {1}
        first = scrapes[0]
        assert first['hf_mirror_build_info{"version": "0.1.0"}'] == 1  # one series, not one per worker
        assert first["hf_mirror_fills_in_flight{}"] == 0
        assert {s["hf_mirror_cache_bytes{}"] for s in scrapes} == {len(response.content)}  # one figure, not a sum
        assert first['hf_mirror_request_duration_seconds_count{"outcome": "hit", "route": "resolve"}'] == hits
        assert first['hf_mirror_served_bytes_total{"source": "cache"}'] > 0
    assert not files.exists()  # removed when the server stopped


def test_one_process_names_units_last_and_no_created_series(emu, tmp_path):
    with MirrorProcess(emu.url, tmp_path / "cache", "--max-size", "1GiB") as mirror:
        httpx.get(mirror.url + FILE)
        httpx.get(mirror.url + FILE)
        text = httpx.get(mirror.url + "/metrics").text
        assert metric(mirror, "hf_mirror_cache_bytes") > 0
    samples = {s.name: s for f in text_string_to_metric_families(text) for s in f.samples}
    assert "_created" not in text
    assert samples["hf_mirror_quota_bytes"].value == 1024**3
    assert samples["hf_mirror_disk_free_bytes"].value > 0
    assert samples["hf_mirror_build_info"].labels == {"version": "0.1.0"}
    served = sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
                 if s.name == "hf_mirror_served_bytes_total")
    fetched = samples["hf_mirror_upstream_bytes_total"].value
    assert served > 0 and fetched > 0
    # The previous release's names, one release more: the same values.
    assert sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "hf_mirror_bytes_served_total") == served
    assert samples["hf_mirror_bytes_fetched_total"].value == fetched
    assert "hf_mirror_bytes_from_peers_total" in samples and "hf_mirror_peer_bytes_total" in samples


def test_sync_runs_into_the_cache_show_on_metrics(emu, tmp_path):
    cache = tmp_path / "cache"
    good, bad = tmp_path / "nightly.toml", tmp_path / "broken.toml"
    good.write_text('[[repo]]\nid = "acme/tiny-model"\nrevisions = ["main"]\n')
    bad.write_text('[[repo]]\nid = "acme/no-such-model"\nrevisions = ["main"]\n')
    for manifest, code in ((good, 0), (bad, 1)):
        run = subprocess.run([sys.executable, "-m", "mirror", "sync", "--manifest", str(manifest), "--cache-dir",
                              str(cache), "--upstream", emu.url], cwd=REPO_ROOT, capture_output=True, text=True,
                             timeout=120, env={k: v for k, v in os.environ.items() if not k.startswith("HF_")})
        assert run.returncode == code, run.stdout + run.stderr
    with MirrorProcess(emu.url, cache) as mirror:
        samples = scrape(mirror)
    assert samples['hf_mirror_sync_last_run_ok{"manifest": "nightly.toml"}'] == 1
    assert samples['hf_mirror_sync_last_run_ok{"manifest": "broken.toml"}'] == 0
    ran = samples['hf_mirror_sync_last_run_timestamp_seconds{"manifest": "nightly.toml"}']
    assert samples['hf_mirror_sync_last_success_timestamp_seconds{"manifest": "nightly.toml"}'] == ran
    assert 'hf_mirror_sync_last_success_timestamp_seconds{"manifest": "broken.toml"}' not in samples  # never ok
    assert time.time() - 600 < ran <= time.time()


def test_an_unreachable_upstream_counts_as_status_error(tmp_path):
    with MirrorProcess(f"http://127.0.0.1:{free_port()}", tmp_path / "cache") as mirror:
        assert httpx.get(mirror.url + FILE).status_code >= 500
        assert metric(mirror, "hf_mirror_upstream_requests_total", status="error") >= 1
