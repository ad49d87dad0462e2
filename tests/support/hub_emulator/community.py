"""The emulator's read routes beyond files and repo metadata: the caller, users and orgs, likes, discussions,
collections, papers, Spaces' and jobs' hardware, repo sub-routes (likers, auth-check, lfs-files, safetensors
metadata, leaderboard, croissant, compare, Space runtime and variables). Small fixed JSON, in the shapes
huggingface_hub's parsers read. Each function answers ``(status, body, headers)``, or ``None``: not a route here.

Like the Hub: a route about the caller answers 401 without a valid token; a paged list sends ``Link: rel="next"``
(``limit`` and ``cursor``); an unknown route answers 404 without ``X-Error-Code``.
"""

from __future__ import annotations

from typing import Any

from tests.support.hub_emulator.fixtures import DENIED_TOKEN, GOOD_TOKEN

Answer = tuple[int, Any, dict[str, str]]
WHEN = "2024-01-02T03:04:05.000Z"
USERS = {GOOD_TOKEN: "good-user", DENIED_TOKEN: "denied-user"}


def _user(name: str) -> dict[str, Any]:
    return {"user": name, "fullname": name.title(), "avatarUrl": f"/avatars/{name}.png", "isPro": False,
            "type": "user", "_id": name}


def _ok(body: Any, headers: dict[str, str] | None = None) -> Answer:
    return 200, body, headers or {}


def _unauthorized() -> Answer:
    return 401, {"error": "Invalid username or password."}, {"x-error-message": "Invalid username or password."}


def _paged(rows: list[Any], query: dict[str, list[str]], base: str) -> Answer:
    """``limit`` rows from ``cursor``, with the Hub's ``Link`` to the next page."""
    limit = int((query.get("limit") or ["2"])[0])
    start = int((query.get("cursor") or ["0"])[0] or 0)
    headers = {}
    if start + limit < len(rows):
        headers["link"] = f'<{base}?limit={limit}&cursor={start + limit}>; rel="next"'
    return _ok(rows[start: start + limit], headers)


PAPER = {"id": "2401.00001", "title": "Tiny models", "summary": "Small.", "upvotes": 3, "publishedAt": WHEN,
         "authors": [{"name": "Ada"}], "discussionId": "d1"}
COLLECTION = {"slug": "acme/tiny-things-0123456789abcdef01234567", "title": "Tiny things", "owner": {"name": "acme"},
              "lastUpdated": WHEN, "position": 0, "private": False, "theme": "blue", "upvotes": 2,
              "description": "a collection",
              "items": [{"_id": "i1", "id": "acme/tiny-model", "type": "model", "position": 0},
                        {"_id": "i2", "id": "acme/tiny-parquet", "type": "dataset", "position": 1}]}
HARDWARE = [{"name": "cpu-basic", "prettyName": "CPU basic", "cpu": "2 vCPU", "ram": "16 GB", "accelerator": None,
             "unitCostMicroUSD": 0, "unitCostUSD": 0.0, "unitLabel": "hour"}]


def fixed(segments: list[str], query: dict[str, list[str]], token: str | None, host: str) -> Answer | None:
    """Routes not about one repo; ``segments``: the path after ``/api`` (or ``["papers", "<id>.md"]``)."""
    base = f"http://{host}/api/" + "/".join(segments)
    me = USERS.get(token or "")
    match segments:
        case ["whoami-v2"]:
            if me is None:
                return _unauthorized()
            return _ok({"type": "user", "id": me, "name": me, "fullname": me.title(), "orgs": [{"name": "acme"}],
                        "auth": {"type": "access_token", "accessToken": {"displayName": "t", "role": "read"}}})
        case ["models-tags-by-type" | "datasets-tags-by-type"]:
            return _ok({"license": [{"id": "license:mit", "label": "mit", "type": "license"}]})
        case ["spaces", "semantic-search"]:
            q = (query.get("q") or [""])[0]
            return _ok([{"id": "acme/tiny-space", "title": f"about {q}", "author": "acme", "sdk": "gradio",
                         "likes": 1, "score": 0.9}])
        case ["spaces", "hardware"] | ["jobs", "hardware"]:
            return _ok(HARDWARE)
        case ["spaces", "templates"]:
            return _ok({"templates": [{"name": "Gradio", "repoId": "acme/gradio-template", "sdk": "gradio",
                                       "preferredPrivate": False}]})
        case ["users", user, "likes"]:
            return _paged([{"createdAt": WHEN, "repo": {"name": "acme/tiny-model", "type": "model"}},
                           {"createdAt": WHEN, "repo": {"name": "acme/tiny-parquet", "type": "dataset"}},
                           {"createdAt": WHEN, "repo": {"name": f"{user}/space", "type": "space"}}], query, base)
        case ["users", user, "overview"]:
            return _ok({**_user(user), "numFollowers": 2, "numFollowing": 1, "numModels": 1})
        case ["users", _, "followers" | "following"] | ["organizations", _, "followers" | "members"]:
            return _paged([_user("ada"), _user("bob"), _user("cyd")], query, base)
        case ["organizations", org, "overview"]:
            return _ok({"name": org, "fullname": org.title(), "avatarUrl": "/a.png", "isVerified": False,
                        "isFollowing": False, "numUsers": 3, "numModels": 2})
        case ["settings", "repositories"] | ["organizations", _, "settings", "repositories"]:
            if me is None:
                return _unauthorized()
            return _paged([{"id": f"{me}/repo", "type": "model", "visibility": "private", "storage": 10,
                            "updatedAt": WHEN}], query, base)
        case ["settings", "webhooks"]:
            return _unauthorized() if me is None else _ok([])
        case ["collections"]:  # the client numbers the listed collections itself
            return _paged([{k: v for k, v in COLLECTION.items() if k != "position"}], query, base)
        case ["collections", ns, slug]:
            if f"{ns}/{slug}" != COLLECTION["slug"]:
                return 404, {"error": "Collection not found"}, {"x-error-code": "CollectionNotFound"}
            return _ok(COLLECTION)
        case ["papers", "search"]:
            return _ok([{"paper": PAPER, "title": PAPER["title"]}])
        case ["papers", paper] if not paper.endswith(".md"):
            return _ok(PAPER) if paper == PAPER["id"] else (404, {"error": "Paper not found"}, {})
        case ["papers", paper_md]:
            return _ok(f"# {PAPER['title']}\n\n{PAPER['summary']}\n") if paper_md == f"{PAPER['id']}.md" else (
                404, {"error": "Paper not found"}, {})
        case ["daily_papers"]:
            return _ok([{"paper": PAPER, "title": PAPER["title"], "publishedAt": WHEN, "numComments": 1}])
        case ["buckets", _]:
            return _ok([])
    return None


def repo_route(repo_type: str, repo_id: str, action: str, args: list[str], query: dict[str, list[str]],
               token: str | None, host: str) -> Answer | None:
    """Sub-routes of a repo the caller may read (the repo's own checks ran first)."""
    repo = {"name": repo_id, "type": repo_type}
    base = f"http://{host}/api/{repo_type}s/{repo_id}/{action}"
    me = USERS.get(token or "")
    discussion = {"num": 1, "title": "Hello", "status": "open", "createdAt": WHEN, "author": {"name": "ada"},
                  "repo": repo, "isPullRequest": False, "pinned": False, "numComments": 1, "topReactions": []}
    match action, args:
        case "discussions", []:
            return _ok({"discussions": [discussion], "count": 1, "start": 0, "numClosedDiscussions": 0})
        case "discussions", ["1"]:
            event = {"id": "e1", "type": "comment", "createdAt": WHEN, "author": {"name": "ada"},
                     "data": {"edited": False, "hidden": False, "latest": {"raw": "hi", "html": "<p>hi</p>"},
                              "numEdits": 0, "editors": ["ada"], "reactions": [], "identifiedLanguage": None}}
            return _ok({**discussion, "events": [event], "filesWithConflicts": []})
        case "discussions", [_]:
            return 404, {"error": "Discussion not found"}, {"x-error-code": "EntryNotFound"}
        case "likers", []:
            return _paged([_user("ada"), _user("bob"), _user("cyd")], query, base)
        case "auth-check", ([] | ["write"]):
            if me is None:
                return _unauthorized()
            if args == ["write"] and token != GOOD_TOKEN:
                return 403, {"error": "no write access"}, {"x-error-code": "GatedRepo"}
            return _ok({"ok": True})
        case "lfs-files", []:
            if me is None:
                return _unauthorized()
            return _paged([{"fileOid": "f" * 64, "filename": "model.safetensors", "oid": "a" * 64, "size": 1,
                            "pushedAt": WHEN, "ref": "main"}], query, base)
        case "safetensors-metadata", [_, *_]:
            header = {"__metadata__": {"format": "pt"}, "w": {"dtype": "F32", "shape": [2, 2],
                                                              "data_offsets": [0, 16]}}
            return _ok({"index": {"metadata": {"total_size": 16}}, "headers": {"model-00001-of-00001.safetensors":
                                                                               header}})
        case "leaderboard", []:
            return _ok([{"rank": 1, "modelId": "acme/tiny-model", "value": 0.5, "filename": "results.json",
                         "verified": True, "source": {"name": "x"}, "author": {"name": "ada", "type": "user"}}])
        case "croissant", []:
            return _ok({"@context": {"@vocab": "https://schema.org/"}, "@type": "sc:Dataset", "name": repo_id})
        case "compare", [_]:
            return _ok({"files": [], "compare": args[0]})
        case "runtime", []:
            return _ok({"stage": "RUNNING", "hardware": {"current": "cpu-basic", "requested": "cpu-basic"}})
        case "variables" | "secrets", []:
            return _unauthorized() if me is None else _ok({"MODE": {"value": "dev", "updatedAt": WHEN}})
        case "user-access-request", [_]:
            return _unauthorized() if me is None else _ok([])
    return None
