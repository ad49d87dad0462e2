"""The Hub's whole read surface through the mirror (issue 26): the route table (mirror.routetable).

Real ``HfApi`` read calls, run once straight against the Hub emulator and once through a mirror that holds a service
token: each gives the same result both ways, and each request it made upstream carried the caller's own token (or
none), never the service token; the queries of sub-routes arrive whole (the parameters the route reads, nothing
else); no read is refused as an unknown route; a repo-scoped route of a private repo is refused to an anonymous
caller as the Hub refuses it; upstream's errors keep upstream's ``X-Error-Code``, or its absence. Then what is cached:
a second call is a hit, and with upstream down a cached answer is served stale and labelled, an uncached one is a
Hub-shaped 504.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.hub_emulator.fixtures import DENIED_TOKEN, GOOD_TOKEN
from tests.support.hub_emulator.runner import EmulatorHandle
from tests.support.mirror_proc import MirrorProcess, run_client

SERVICE_TOKEN = GOOD_TOKEN  # the mirror's service token: may read everything upstream; no caller may borrow it
CALLER_TOKEN = DENIED_TOKEN  # a caller's own token: a valid user, member of nothing private
SLUG = "acme/tiny-things-0123456789abcdef01234567"

# Every call: (name, expression over ``api`` (HfApi with the caller's token) and ``anon`` (HfApi without one)).
# Lists are materialised; results are compared by repr, the endpoint's address replaced.
CALLS: list[tuple[str, str]] = [
    ("whoami", "api.whoami()"),
    ("auth_check", "api.auth_check('acme/tiny-model')"),
    ("auth_check_private_anon", "anon.auth_check('acme/private-model')"),
    ("list_models", "list(api.list_models(search='tiny', limit=5))"),
    ("list_datasets", "list(anon.list_datasets(author='acme'))"),
    ("list_spaces", "list(anon.list_spaces(limit=2))"),
    ("get_model_tags", "anon.get_model_tags()"),
    ("get_dataset_tags", "anon.get_dataset_tags()"),
    ("search_spaces", "list(anon.search_spaces('image generation', sdk='gradio'))"),
    ("list_spaces_hardware", "anon.list_spaces_hardware()"),
    ("list_space_templates", "anon.list_space_templates()"),
    ("list_jobs_hardware", "anon.list_jobs_hardware()"),
    ("list_liked_repos", "anon.list_liked_repos('ada')"),
    ("list_repo_likers", "list(anon.list_repo_likers('acme/tiny-model'))"),
    ("get_user_overview", "anon.get_user_overview('ada')"),
    ("list_user_followers", "list(anon.list_user_followers('ada'))"),
    ("list_user_following", "list(anon.list_user_following('ada'))"),
    ("get_organization_overview", "anon.get_organization_overview('acme')"),
    ("list_organization_members", "list(anon.list_organization_members('acme'))"),
    ("list_organization_followers", "list(anon.list_organization_followers('acme'))"),
    ("list_user_repos", "list(api.list_user_repos())"),
    ("list_webhooks", "api.list_webhooks()"),
    ("list_collections", "list(anon.list_collections(owner='acme', limit=5))"),
    ("get_collection", f"anon.get_collection({SLUG!r})"),
    ("list_papers", "list(anon.list_papers(query='tiny'))"),
    ("paper_info", "anon.paper_info('2401.00001')"),
    ("paper_info_missing", "anon.paper_info('2401.99999')"),
    ("read_paper", "anon.read_paper('2401.00001')"),
    ("list_daily_papers", "list(anon.list_daily_papers())"),
    ("get_repo_discussions", "list(anon.get_repo_discussions('acme/tiny-model', discussion_status='open'))"),
    ("get_discussion_details", "anon.get_discussion_details('acme/tiny-model', 1)"),
    ("discussions_private_anon", "list(anon.get_repo_discussions('acme/private-model'))"),
    ("list_lfs_files", "list(api.list_lfs_files('acme/tiny-model'))"),
    ("get_sharded_safetensors_metadata", "anon.get_sharded_safetensors_metadata('acme/tiny-model')"),
    ("get_dataset_leaderboard", "anon.get_dataset_leaderboard('acme/tiny-parquet')"),
    ("get_space_runtime", "anon.get_space_runtime('acme/tiny-space')"),
    ("get_space_variables", "api.get_space_variables('acme/tiny-space')"),
    ("list_pending_access_requests", "list(api.list_pending_access_requests('acme/tiny-model'))"),
    ("list_repo_commits", "len(list(anon.list_repo_commits('acme/tiny-model')))"),
    ("list_repo_refs", "anon.list_repo_refs('acme/tiny-model')"),
    ("model_info", "anon.model_info('acme/tiny-model').sha"),
]

CLIENT = """
import json, os, re
from huggingface_hub import HfApi
api, anon = HfApi(token=os.environ["CALLER_TOKEN"]), HfApi(token=False)
out = {}
for name, expression in json.loads(os.environ["CALLS"]):
    try:
        value = eval(expression)
        out[name] = repr(value)
    except Exception as exc:
        status = getattr(getattr(exc, "response", None), "status_code", None)
        out[name] = f"{type(exc).__name__} {status}"
endpoint = os.environ["HF_ENDPOINT"]
print(json.dumps({k: v.replace(endpoint, "<endpoint>") for k, v in out.items()}))
"""


def run_calls(endpoint: str, hf_home: Path, calls: list[tuple[str, str]] = CALLS) -> dict[str, str]:
    result = run_client(CLIENT, endpoint, hf_home, CALLER_TOKEN=CALLER_TOKEN, CALLS=json.dumps(calls))
    assert isinstance(result, dict)
    return result


@pytest.fixture(scope="module")
def service_mirror(emulator: EmulatorHandle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MirrorProcess]:
    cache = tmp_path_factory.mktemp("read-surface") / "cache"
    with MirrorProcess(emulator.url, cache, "--upstream-token", SERVICE_TOKEN,
                       "--deny-repos", "model:acme/gated-*") as proc:
        yield proc


def test_every_read_call_gives_the_same_result_through_the_mirror(emulator, service_mirror, tmp_path):
    direct = run_calls(emulator.url, tmp_path / "direct")
    emulator.reset_stats()
    mirrored = run_calls(service_mirror.url, tmp_path / "mirrored")
    records = emulator.requests()
    assert mirrored == direct, {k: (direct.get(k), mirrored.get(k)) for k in direct if direct.get(k) != mirrored.get(k)}
    # The calls that must fail, fail as upstream fails them (nothing refused by the mirror as an unknown route).
    assert direct["discussions_private_anon"].startswith("RepositoryNotFoundError"), direct
    assert direct["auth_check_private_anon"].startswith("RepositoryNotFoundError"), direct
    assert direct["paper_info_missing"] == "HfHubHTTPError 404", direct
    assert not [v for v in mirrored.values() if "RouteNotFound" in v]
    # Every request upstream: a read, with the caller's own token or none; never the service token.
    assert records and all(r["method"] in ("GET", "HEAD") for r in records), records
    assert not [r for r in records if r["auth"] and SERVICE_TOKEN in r["auth"]], records
    assert {r["auth"] for r in records} == {None, f"Bearer {CALLER_TOKEN}"}, records
    paths = [r["path"] for r in records]
    assert any(p.startswith("/api/spaces/semantic-search?") and "q=image+generation" in p and "sdk=gradio" in p
               for p in paths), paths
    assert any(re.match(r"^/api/models/acme/tiny-model/discussions\?.*status=open", p) for p in paths), paths
    assert not [p for p in paths if p.startswith("/api/spaces/semantic-search") and "q=" not in p], paths


# Read commands of the ``hf`` CLI (huggingface_hub 2.4.0), each run straight against the emulator and through the
# mirror: the same exit status and output.
HF_COMMANDS: list[list[str]] = [
    ["auth", "whoami"],
    ["models", "ls", "--search", "tiny", "--limit", "5"],
    ["models", "info", "acme/tiny-model"],
    ["datasets", "ls", "--author", "acme"],
    ["spaces", "ls", "--limit", "2"],
    ["papers", "ls"],
    ["papers", "info", "2401.00001"],
    ["papers", "read", "2401.00001"],
    ["papers", "search", "tiny"],
    ["collections", "ls", "--owner", "acme"],
    ["collections", "info", SLUG],
    ["discussions", "list", "acme/tiny-model"],
    ["discussions", "info", "acme/tiny-model", "1"],
    ["repos", "ls"],
]

HF_CLI = """
import json, os, subprocess, sys
hf = os.path.join(os.path.dirname(sys.executable), "hf")
out = []
for command in json.loads(os.environ["COMMANDS"]):
    done = subprocess.run([hf, *command], capture_output=True, text=True, timeout=60)
    out.append([command, done.returncode, done.stdout.replace(os.environ["HF_ENDPOINT"], "<endpoint>")])
print(json.dumps(out))
"""


def test_hf_cli_read_commands_give_the_same_output_through_the_mirror(emulator, service_mirror, tmp_path):
    env = {"HF_TOKEN": CALLER_TOKEN, "COMMANDS": json.dumps(HF_COMMANDS)}
    direct = run_client(HF_CLI, emulator.url, tmp_path / "direct", timeout=600, **env)
    mirrored = run_client(HF_CLI, service_mirror.url, tmp_path / "mirrored", timeout=600, **env)
    assert isinstance(direct, list) and isinstance(mirrored, list)
    for (command, status, stdout), (_, status_m, stdout_m) in zip(direct, mirrored, strict=True):
        assert (status_m, stdout_m) == (status, stdout), (command, stdout, stdout_m)
        assert status == 0 and stdout.strip(), (command, status, stdout)


def test_fixed_routes_are_not_repos_and_keep_their_query(emulator, service_mirror):
    with httpx.Client(base_url=service_mirror.url, timeout=30) as client:
        for path in ("/api/spaces/semantic-search", "/api/spaces/hardware", "/api/spaces/templates"):
            emulator.reset_stats()
            response = client.get(path, params={"q": "cats", "junk": "1"})
            assert response.status_code == 200, (path, response.text[:300])
            assert "siblings" not in response.text and "sha" not in response.json(), path
            paths = [r["path"] for r in emulator.requests()]
            if response.headers["x-mirror-cache"] == "hit":  # hardware and templates: asked by the sweep already
                assert paths == [], paths
            else:  # junk never leaves the mirror; a parameter the route reads always does
                assert paths == [path + ("?q=cats" if "search" in path else "")], paths


def test_upstream_errors_are_relayed_as_upstream_sent_them(emulator, service_mirror):
    with httpx.Client(base_url=service_mirror.url, timeout=30) as client:
        missing = client.get("/api/papers/2401.99999")
        assert missing.status_code == 404 and "x-error-code" not in missing.headers, dict(missing.headers)
        whoami = client.get("/api/whoami-v2")  # anonymous: upstream's 401, without a code
        assert whoami.status_code == 401 and "x-error-code" not in whoami.headers, dict(whoami.headers)
        private = client.get("/api/models/acme/private-model/discussions")
        assert private.status_code == 401 and private.headers["x-error-code"] == "RepoNotFound"
        unknown = client.get("/api/models/acme/tiny-model/some/unknown/route")  # still refused by the mirror
        assert unknown.status_code in (400, 404) and unknown.headers.get("x-error-code")


def test_repo_policies_run_on_every_repo_scoped_route(emulator, service_mirror):
    private = "/api/models/acme/private-model/likers"
    with httpx.Client(base_url=service_mirror.url, timeout=30) as client:
        emulator.reset_stats()
        for path in ("/api/models/acme/gated-model/discussions", "/api/models/acme/gated-model/likers",
                     "/api/models/acme/gated-model/auth-check"):
            denied = client.get(path, headers={"authorization": f"Bearer {GOOD_TOKEN}"})
            assert denied.status_code == 403 and denied.headers.get("x-error-code"), path  # the deny list
        assert emulator.requests() == []
        # Cached for an entitled caller (its own token), then asked anonymously and by a caller without access:
        # refused as the Hub refuses them, the cached answer never served.
        entitled = client.get(private, headers={"authorization": f"Bearer {GOOD_TOKEN}"})
        assert entitled.status_code == 200 and entitled.headers["x-mirror-cache"] == "miss"
        anonymous = client.get(private)
        assert anonymous.status_code == 401 and anonymous.headers["x-error-code"] == "RepoNotFound"
        other = client.get(private, headers={"authorization": f"Bearer {DENIED_TOKEN}"})
        assert other.status_code == 404 and other.headers["x-error-code"] == "RepoNotFound"
        assert b"ada" not in anonymous.content + other.content
        again = client.get(private, headers={"authorization": f"Bearer {GOOD_TOKEN}"})
        assert again.status_code == 200 and again.headers["x-mirror-cache"] == "hit"


CACHED = ("/api/models/acme/tiny-model/likers", "/api/collections?owner=acme", "/api/daily_papers")


def test_answers_are_cached_as_the_route_table_says(emulator, service_mirror):
    with httpx.Client(base_url=service_mirror.url, timeout=30) as client:
        first = {path: client.get(path) for path in CACHED}
        assert all(r.status_code == 200 for r in first.values()), first
        emulator.reset_stats()
        again = {path: client.get(path + ("&" if "?" in path else "?") + "junk=1") for path in CACHED}
        assert all(r.headers["x-mirror-cache"] == "hit" and r.content == first[p].content for p, r in again.items())
        assert emulator.requests() == []  # junk in a query is no new key
        fresh = client.get(CACHED[2], headers={"cache-control": "no-cache"})  # what the nightly sync sends
        assert fresh.headers["x-mirror-cache"] == "miss" and len(emulator.requests()) == 1
        mine = client.get("/api/whoami-v2", headers={"authorization": f"Bearer {CALLER_TOKEN}"})
        assert mine.status_code == 200 and mine.json()["name"] == "denied-user"
        other = client.get("/api/whoami-v2", headers={"authorization": f"Bearer {GOOD_TOKEN}"})
        assert other.json()["name"] == "good-user"  # per caller: never another caller's answer
        private = client.get("/api/settings/repositories", headers={"authorization": f"Bearer {CALLER_TOKEN}"})
        assert private.status_code == 200
        assert client.get("/api/settings/repositories").status_code == 401  # not the cached answer of a token


def test_cached_answers_are_served_stale_when_upstream_fails(emulator, tmp_path):
    # Every answer is old at once; a 503 is still retried (four times), without the default backoff's 3.75 s per
    # request (the retry policy's timing is the unit tests' claim, tests/unit/test_upstream.py).
    env = {"HF_MIRROR_READ_TTL": "0", "HF_MIRROR_REVISION_TTL": "0", "HF_MIRROR_RETRY_BACKOFF_MAX": "0.05"}
    with MirrorProcess(emulator.url, tmp_path / "cache", env=env) as mirror, \
            httpx.Client(base_url=mirror.url, timeout=30) as client:
        first = {path: client.get(path) for path in CACHED}
        assert all(r.status_code == 200 and r.headers["x-mirror-cache"] == "miss" for r in first.values()), first
        emulator.set_faults(down=True)
        try:
            for path in CACHED:
                stale = client.get(path)
                assert stale.status_code == 200 and stale.content == first[path].content, path
                assert stale.headers["x-mirror-cache"] == "stale" and stale.headers["warning"].startswith("110")
            cold = client.get("/api/papers/search", params={"q": "never asked"})
            assert cold.status_code == 504 and cold.headers.get("x-error-code") and cold.json()["error"]
        finally:
            emulator.clear_faults()
    # --offline on the same cache: the same, without asking upstream at all.
    emulator.reset_stats()
    with MirrorProcess(emulator.url, tmp_path / "cache", "--offline", env=env) as offline, \
            httpx.Client(base_url=offline.url, timeout=30) as client:
        for path in CACHED:
            stale = client.get(path)
            assert stale.status_code == 200 and stale.content == first[path].content, path
            assert stale.headers["x-mirror-cache"] == "stale" and stale.headers["warning"].startswith("110")
        cold = client.get("/api/users/ada/overview")
        assert cold.status_code == 504 and cold.headers["x-error-code"] == "OfflineMiss"
    assert emulator.requests() == []
