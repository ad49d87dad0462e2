"""Checks of the deployment files in deploy/ and docker-compose.yml (fast; no Docker engine, no network).

Needs: pyyaml (Python) and the nginx binary (apt-get install nginx). Uses when present: `docker compose` or
`docker-compose` (compose validation), `systemd-analyze` (unit verification), `openssl` (TLS snippet check).
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import re
import shlex
import shutil
import subprocess
import threading
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from mirror.sync.manifest import parse_manifest
from tests.support.nginx_front import (
    BLOBS_PREFIX,
    NginxFront,
    free_port,
    nginx_binary,
    nginx_test,
    render_nginx_conf,
)

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE = ROOT / "docker-compose.yml"
K8S = DEPLOY / "k8s"
SYSTEMD = DEPLOY / "systemd"
CACHE = "/var/cache/hf-mirror"
SERVE_CMD = ["hf-mirror", "serve", "--host", "0.0.0.0", "--port", "8090", "--cache-dir", CACHE]
SYNC_CMD = ["hf-mirror", "sync", "--manifest", "/etc/hf-mirror/sync.toml", "--cache-dir", CACHE]

YAML_FILES = sorted([*DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml"), COMPOSE])


def _load_all(path: Path) -> list:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def _k8s_docs() -> dict[tuple[str, str], dict]:
    docs = {}
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in _load_all(path):
            docs[(doc["kind"], doc["metadata"]["name"])] = doc
    return docs


def _nginx() -> str:
    binary = nginx_binary()
    if binary is None:
        pytest.fail("nginx is not installed: apt-get install nginx (the .ci/run script does)")
    return binary


# ---------------------------------------------------------------------------------------------------- YAML / k8s


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_yaml_parses(path):
    docs = _load_all(path)
    assert docs, f"{path} is empty"
    if K8S in path.parents:
        for doc in docs:
            assert isinstance(doc, dict)
            assert doc.get("apiVersion"), f"{path}: a document without apiVersion"
            assert doc.get("kind"), f"{path}: a document without kind"


def test_kustomization_lists_every_manifest():
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert kust["kind"] == "Kustomization"
    listed = set(kust["resources"])
    present = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == present
    assert {"deployment.yaml", "service.yaml", "pvc.yaml", "configmap.yaml", "cronjob.yaml"} <= listed


def _pod_spec(doc: dict) -> dict:
    if doc["kind"] == "CronJob":
        return doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return doc["spec"]["template"]["spec"]


def test_k8s_references_are_consistent():
    docs = _k8s_docs()
    deployment = docs[("Deployment", "hf-mirror")]
    cronjob = docs[("CronJob", "hf-mirror-sync")]
    service = docs[("Service", "hf-mirror")]
    pvc_names = {name for kind, name in docs if kind == "PersistentVolumeClaim"}
    configmaps = {name: doc for (kind, name), doc in docs.items() if kind == "ConfigMap"}

    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["selector"].items() <= labels.items()
    port_names = {p["name"] for c in _pod_spec(deployment)["containers"] for p in c.get("ports", [])}
    assert all(p["targetPort"] in port_names or isinstance(p["targetPort"], int) for p in service["spec"]["ports"])

    for doc in (deployment, cronjob):
        spec = _pod_spec(doc)
        claims = {v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"] if "persistentVolumeClaim" in v}
        assert claims and claims <= pvc_names
        volume_names = {v["name"] for v in spec["volumes"]}
        for volume in spec["volumes"]:
            if "configMap" in volume:
                assert volume["configMap"]["name"] in configmaps
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] != 0
        for container in spec["containers"]:
            assert {m["name"] for m in container["volumeMounts"]} <= volume_names
            assert any(m["mountPath"] == CACHE for m in container["volumeMounts"])
            assert container["securityContext"]["allowPrivilegeEscalation"] is False
            assert container["resources"]["requests"] and container["resources"]["limits"]
            for ref in container.get("envFrom", []):
                assert ref["configMapRef"]["name"] in configmaps
            env = {e["name"]: e for e in container.get("env", [])}
            token = env["HF_MIRROR_UPSTREAM_TOKEN"]["valueFrom"]["secretKeyRef"]
            assert token["key"] == "HF_TOKEN" and token["optional"] is True

    server = _pod_spec(deployment)["containers"][0]
    assert server["args"] == SERVE_CMD
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert server[probe]["httpGet"]["path"] == "/healthz"

    assert cronjob["spec"]["concurrencyPolicy"] == "Forbid"
    _check_cron_fields(cronjob["spec"]["schedule"].split())
    sync = _pod_spec(cronjob)["containers"][0]
    assert sync["args"] == SYNC_CMD
    manifest_mount = next(m for m in sync["volumeMounts"] if m["mountPath"] == "/etc/hf-mirror")
    manifest_volume = next(v for v in _pod_spec(cronjob)["volumes"] if v["name"] == manifest_mount["name"])
    assert "sync.toml" in configmaps[manifest_volume["configMap"]["name"]]["data"]


def test_exposed_overlay_points_at_the_base():
    """deploy/k8s/overlays/exposed: an Ingress to the mirror's Service and a NetworkPolicy around its pods."""
    overlay = K8S / "overlays" / "exposed"
    kust = yaml.safe_load((overlay / "kustomization.yaml").read_text())
    for resource in kust["resources"]:
        assert (overlay / resource).exists(), resource
    docs = _k8s_docs()
    service = docs[("Service", "hf-mirror")]
    labels = docs[("Deployment", "hf-mirror")]["spec"]["template"]["metadata"]["labels"]
    ingress = _load_all(overlay / "ingress.yaml")[0]
    for rule in ingress["spec"]["rules"]:
        for path in rule["http"]["paths"]:
            backend = path["backend"]["service"]
            assert backend["name"] == service["metadata"]["name"]
            assert backend["port"]["name"] in {p["name"] for p in service["spec"]["ports"]}
    hosts = [rule["host"] for rule in ingress["spec"]["rules"]]
    assert any(h.startswith("datasets-server.") for h in hosts), "the viewer's host needs its own rule"
    policy = _load_all(overlay / "networkpolicy.yaml")[0]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    assert set(policy["spec"]["policyTypes"]) == {"Ingress", "Egress"}


def test_images_are_versioned():
    """No :latest anywhere: a rollout names the release it runs."""
    for path in [COMPOSE, *DEPLOY.rglob("*.yaml")]:
        for doc in _load_all(path):
            text = json.dumps(doc)
            assert "hf-mirror:latest" not in text and 'newTag": "latest' not in text, path
    for name, svc in _compose()["services"].items():
        if svc.get("image", "").startswith("hf-mirror"):
            assert svc["env_file"][0]["path"] == "./hf-mirror.env" and svc["env_file"][0]["required"] is False, name
    assert (DEPLOY / "hf-mirror.env.example").is_file()


# ---------------------------------------------------------------------------------------------------------- TOML

def _check_manifest(text: str, where: str) -> None:
    """The sync's own parser reads it (every rule it has, none copied here), and it selects something."""
    manifest = parse_manifest(tomllib.loads(text), Path(where))
    assert manifest.repos or getattr(manifest, "selections", None), f"{where} selects no repo"


def test_sync_example_toml_parses():
    _check_manifest((DEPLOY / "sync.example.toml").read_text(), "deploy/sync.example.toml")


def test_k8s_sync_manifest_parses():
    configmap = _k8s_docs()[("ConfigMap", "hf-mirror-sync")]
    _check_manifest(configmap["data"]["sync.toml"], "deploy/k8s/configmap.yaml: sync.toml")


@pytest.mark.parametrize("path", sorted(DEPLOY.rglob("*.toml")), ids=lambda p: p.name)
def test_every_toml_parses(path):
    tomllib.loads(path.read_text())


# ------------------------------------------------------------------------------------------------------- compose


def _compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def test_compose_structure():
    compose = _compose()
    services = compose["services"]
    named_volumes = set(compose.get("volumes") or {})
    assert {"mirror", "nginx", "sync"} <= set(services)
    for name, svc in services.items():
        assert "build" in svc or "image" in svc, name
        if "build" in svc:
            assert svc["build"]["context"] == "."
            assert (ROOT / svc["build"]["dockerfile"]).is_file()
        for volume in svc.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith((".", "/")):
                assert (ROOT / source).exists(), f"{name}: bind source {source} missing"
            else:
                assert source in named_volumes, f"{name}: volume {source} is not declared"
        for dep in svc.get("depends_on", {}):
            assert dep in services
        mode = svc.get("network_mode", "")
        if mode.startswith("service:"):
            assert mode.split(":", 1)[1] in services
            assert "ports" not in svc

    mirror = services["mirror"]
    assert "profiles" not in mirror
    assert mirror["build"]["dockerfile"] == "deploy/Dockerfile"
    assert any(str(p).endswith(":8090") for p in mirror["ports"])
    assert any(v.endswith(f":{CACHE}") for v in mirror["volumes"])
    assert {"HF_MIRROR_UPSTREAM", "HF_MIRROR_REVISION_TTL", "HF_TOKEN"} <= set(mirror["environment"])
    assert mirror["healthcheck"]["test"][0] in ("CMD", "CMD-SHELL")

    nginx = services["nginx"]
    assert nginx["profiles"] == ["nginx"]
    assert nginx["image"].split(":")[0] in ("nginx", "docker.io/library/nginx")
    assert "./deploy/nginx.conf:/etc/nginx/nginx.conf:ro" in nginx["volumes"]
    assert any(v.endswith(f":{CACHE}:ro") for v in nginx["volumes"])
    accel = services[nginx["network_mode"].split(":", 1)[1]]
    assert "nginx" in accel["profiles"]
    cmd = accel["command"]
    assert cmd[cmd.index("--accel-redirect") + 1] == BLOBS_PREFIX
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1", "the accel-redirect mirror must not be reachable directly"

    sync = services["sync"]
    assert sync["profiles"] == ["sync"]
    assert sync["command"] == SYNC_CMD
    assert "./deploy/sync.example.toml:/etc/hf-mirror/sync.toml:ro" in sync["volumes"]
    assert sync.get("restart", "no") == "no"


def _compose_cli() -> list[str] | None:
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy else None


def test_compose_config_validates():
    cli = _compose_cli()
    if cli is None:
        pytest.skip("neither the docker compose plugin nor docker-compose is installed (structure checked above)")
    env = {**os.environ, "HF_TOKEN": "hf_test"}
    for profiles in ([], ["--profile", "nginx", "--profile", "sync"], ["--profile", "fleet"]):
        proc = subprocess.run(
            [*cli, "-f", str(COMPOSE), *profiles, "config", "-q"], capture_output=True, text=True, env=env, cwd=ROOT
        )
        assert proc.returncode == 0, proc.stderr
    proc = subprocess.run(
        [*cli, "-f", str(COMPOSE), "--profile", "nginx", "--profile", "sync", "config", "--services"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert {"mirror", "nginx", "sync"} <= set(proc.stdout.split())


# ------------------------------------------------------------------------------------------------- the fleet profile

FLEET_NODES = ("node1", "node2", "node3")
# Names whose values are credentials: in compose they may only be ${VAR} references, in Kubernetes only secretKeyRef.
SECRET_NAME = re.compile(r"PASSWORD|SECRET|ACCESS_KEY|TOKEN|METADATA_URL", re.IGNORECASE)
_INTERPOLATION = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")


def _resolve(value: object) -> str:
    """What compose makes of a value when no variable is set: each ``${VAR:-default}`` becomes its default."""
    return _INTERPOLATION.sub(lambda m: m.group(2) or "", "" if value is None else str(value))


def test_compose_fleet_profile():
    services = _compose()["services"]
    fleet = {name for name, svc in services.items() if "fleet" in svc.get("profiles", [])}
    assert fleet == {"postgres", "seaweedfs", *FLEET_NODES, "fleet-nginx"}
    assert services["postgres"]["image"] == "postgres:15"
    assert services["seaweedfs"]["image"].split(":")[0] in ("chrislusf/seaweedfs", "minio/minio")
    bucket = services["seaweedfs"]["command"]
    buckets, endpoints, prefixes, databases = set(), set(), set(), set()
    for name in FLEET_NODES:
        node = services[name]
        env = {key: _resolve(value) for key, value in node["environment"].items()}
        assert node["command"] == SERVE_CMD, name
        assert env["HF_MIRROR_STORAGE"] == "s3", name
        assert env["HF_MIRROR_METADATA_URL"].startswith("postgresql://"), name
        assert env["HF_MIRROR_NODE_URL"] == f"http://{name}:8090", "each node publishes its own address"
        buckets.add(env["HF_MIRROR_S3_BUCKET"])
        endpoints.add(env["HF_MIRROR_S3_ENDPOINT"])
        prefixes.add(env["HF_MIRROR_S3_PREFIX"])
        databases.add(env["HF_MIRROR_METADATA_URL"])
        assert node["healthcheck"]["test"][0] in ("CMD", "CMD-SHELL")
        assert {dep: cond["condition"] for dep, cond in node["depends_on"].items()} == \
            {"postgres": "service_healthy", "seaweedfs": "service_healthy"}
        assert [v.split(":")[1] for v in node["volumes"]] == [CACHE]
    assert len(buckets) == len(endpoints) == len(prefixes) == len(databases) == 1, "one bucket and database"
    assert f"-bucket={buckets.pop()}" in {_resolve(arg) for arg in bucket}, "the S3 server creates that bucket"
    assert endpoints.pop() == "http://seaweedfs:8333"
    assert "@postgres:5432/" in databases.pop()
    hot_tiers = [services[name]["volumes"][0].split(":")[0] for name in FLEET_NODES]
    assert len(set(hot_tiers)) == 3, "each node has a hot tier of its own"
    for name in ("postgres", "seaweedfs", "fleet-nginx"):
        assert services[name]["healthcheck"]["test"][0] in ("CMD", "CMD-SHELL"), name
    front = services["fleet-nginx"]
    assert {dep: cond["condition"] for dep, cond in front["depends_on"].items()} == \
        {name: "service_healthy" for name in FLEET_NODES}
    assert "./deploy/nginx-fleet.conf:/etc/nginx/nginx.conf:ro" in front["volumes"]


def test_compose_holds_no_secret():
    """Every credential in docker-compose.yml is a ${VAR} reference with no default but empty, and no DSN carries a
    password."""
    for name, svc in _compose()["services"].items():
        env = svc.get("environment") or {}
        if isinstance(env, list):
            env = dict(item.partition("=")[::2] for item in env)
        for key, value in env.items():
            if value is None or not SECRET_NAME.search(key) or key == "GF_SECURITY_ADMIN_PASSWORD":
                continue  # (Grafana's local admin password defaults to admin, documented in the file)
            text = str(value)
            if key.endswith("METADATA_URL"):
                assert not re.search(r"://[^/@:]+:[^/@]+@", _resolve(text)), f"{name}: a password in {key}"
                continue
            assert re.fullmatch(r"\$\{\w+(:-)?\}", text), f"{name}: {key} must be ${{VAR}}, from the shell or .env"
    assert "POSTGRES_PASSWORD=" in (DEPLOY / "fleet.env.example").read_text()


def _fleet_nginx_conf(tmp_path: Path) -> Path:
    """deploy/nginx-fleet.conf runnable here: the node names become local ports, paths go under ``tmp_path``."""
    text = (DEPLOY / "nginx-fleet.conf").read_text()
    ports = {}
    for name in FLEET_NODES:
        ports[name] = free_port()
        text = text.replace(f"server {name}:8090", f"server 127.0.0.1:{ports[name]}")
    text = re.sub(r"listen 8080;", f"listen 127.0.0.1:{free_port()};", text)
    text = text.replace("pid /tmp/nginx.pid;", f"pid {tmp_path}/nginx.pid;")
    (tmp_path / "logs").mkdir(exist_ok=True)
    conf = tmp_path / "nginx.conf"
    conf.write_text(text)
    return conf


def test_nginx_fleet_conf(tmp_path):
    text = (DEPLOY / "nginx-fleet.conf").read_text()
    upstream = re.search(r"upstream\s+hf_mirror_fleet\s*\{(.*?)\}", text, re.DOTALL).group(1)
    assert re.findall(r"^\s*server\s+([\w.-]+):8090\b", upstream, re.MULTILINE) == list(FLEET_NODES)
    live = "\n".join(line.split("#", 1)[0] for line in upstream.splitlines())
    for sticky in ("ip_hash", "hash ", "sticky", "least_conn"):
        assert sticky not in live, f"the front must balance round robin, not {sticky.strip()}"
    for directive in ("proxy_buffering off;", "proxy_request_buffering off;", "proxy_read_timeout"):
        assert directive in text
    assert "X-Accel-Redirect" not in text.replace("no X-Accel-Redirect", "")
    proc = nginx_test(_fleet_nginx_conf(tmp_path), _nginx())
    assert proc.returncode == 0, proc.stderr


# ------------------------------------------------------------------------------------------- k8s: the fleet's database

SCALE_OUT = DEPLOY / "k8s-scale-out"


def _env_of(doc: dict) -> dict[str, dict]:
    return {e["name"]: e for c in _pod_spec(doc)["containers"] for e in c.get("env", [])}


def test_k8s_database_overlay():
    overlay = SCALE_OUT / "database"
    kust = yaml.safe_load((overlay / "kustomization.yaml").read_text())
    assert kust["kind"] == "Kustomization" and "../base" in kust["resources"]
    for patch in kust["patches"]:
        if "path" in patch:
            assert (overlay / patch["path"]).is_file(), patch["path"]
    patch = _load_all(overlay / "deployment-patch.yaml")[0]
    base = {(d["kind"], d["metadata"]["name"]): d for p in sorted((SCALE_OUT / "base").glob("*.yaml"))
            if p.name != "kustomization.yaml" for d in _load_all(p)}
    assert ("Deployment", patch["metadata"]["name"]) in base
    base_names = {c["name"] for c in _pod_spec(base[("Deployment", patch["metadata"]["name"])])["containers"]}
    assert {c["name"] for c in _pod_spec(patch)["containers"]} <= base_names
    dsn = _env_of(patch)["HF_MIRROR_METADATA_URL"]["valueFrom"]["secretKeyRef"]
    assert dsn == {"name": "hf-mirror-metadata", "key": "HF_MIRROR_METADATA_URL"}, "required: not optional"
    xet = _env_of(base[("Deployment", "hf-mirror-fleet")])["HF_MIRROR_XET_SIGNING_SECRET"]
    assert xet["valueFrom"]["secretKeyRef"]["name"] == "hf-mirror-xet"


def test_k8s_database_overlay_renders():
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (the overlay is checked by parsing above)")
    proc = subprocess.run([kubectl, "kustomize", str(SCALE_OUT / "database")], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(proc.stdout)}
    deployment = docs[("Deployment", "hf-mirror-fleet")]
    env = _env_of(deployment)
    assert env["HF_MIRROR_METADATA_URL"]["valueFrom"]["secretKeyRef"]["name"] == "hf-mirror-metadata"
    assert "HF_MIRROR_NODE_URL" in env and "HF_MIRROR_UPSTREAM_TOKEN" in env, "the base's env is kept"
    config = docs[("ConfigMap", "hf-mirror-fleet-config")]["data"]
    assert config["HF_MIRROR_STORAGE"] == "s3" and float(config["HF_MIRROR_FLEET_LEASE_SECONDS"]) > 0
    assert deployment["spec"]["replicas"] == 3


def test_k8s_manifests_hold_no_secret():
    """No Secret object with data in deploy/, no credential in a ConfigMap, every credential env var from a Secret."""
    for path in sorted([*DEPLOY.rglob("*.yaml")]):
        for doc in _load_all(path):
            if not isinstance(doc, dict) or "kind" not in doc:
                continue
            if doc["kind"] == "Secret":
                assert not doc.get("data") and not doc.get("stringData"), f"{path}: a Secret with values"
            if doc["kind"] == "ConfigMap":
                leaked = [key for key in doc.get("data", {}) if SECRET_NAME.search(key)]
                assert not leaked, f"{path}: credentials in a ConfigMap: {leaked}"
            if doc["kind"] in ("Deployment", "CronJob", "StatefulSet"):
                for name, entry in _env_of(doc).items():
                    if SECRET_NAME.search(name):
                        assert "secretKeyRef" in entry.get("valueFrom", {}), f"{path}: {name} is not from a Secret"


# ----------------------------------------------------------------------------------------------------- Dockerfile


def _dockerfile_instructions() -> list[tuple[str, str]]:
    text = (DEPLOY / "Dockerfile").read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


def test_dockerfile():
    instructions = _dockerfile_instructions()
    froms = [rest for kw, rest in instructions if kw == "FROM"]
    assert froms and all(f.split()[0] == "python:3.11-slim" for f in froms)
    final = instructions[max(i for i, (kw, _) in enumerate(instructions) if kw == "FROM") :]
    kinds = {kw: rest for kw, rest in final}
    users = [rest for kw, rest in final if kw == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert users[-1] == "hfmirror"
    assert any(kw == "RUN" and "useradd" in rest and "hfmirror" in rest for kw, rest in final)
    assert any(kw == "RUN" and "pip install" in rest for kw, rest in instructions)
    assert "8090" in kinds["EXPOSE"].split()
    assert CACHE in kinds["VOLUME"]
    assert json.loads(kinds["CMD"]) == SERVE_CMD
    healthcheck = kinds["HEALTHCHECK"]
    assert "http://127.0.0.1:8090/healthz" in healthcheck
    exec_form = json.loads(healthcheck[healthcheck.index("CMD") + 3 :])
    assert exec_form[:2] == ["python", "-c"]
    compile(exec_form[2], "<healthcheck>", "exec")
    assert (DEPLOY / "Dockerfile.dockerignore").read_text().count(".venv")


def test_compose_healthcheck_is_valid_python():
    test = _compose()["services"]["mirror"]["healthcheck"]["test"]
    assert test[1:3] == ["python", "-c"]
    compile(test[3], "<healthcheck>", "exec")
    assert "/healthz" in test[3]


# ---------------------------------------------------------------------------------------------------------- nginx


def test_nginx_conf_contract():
    text = (DEPLOY / "nginx.conf").read_text()
    assert re.search(r"^events\s*\{", text, re.MULTILINE) and re.search(r"^http\s*\{", text, re.MULTILINE)
    internal = re.search(r"location\s+/_hf_mirror_blobs/\s*\{(.*?)\n\s*\}", text, re.DOTALL).group(1)
    assert re.search(r"^\s*internal;", internal, re.MULTILINE)
    assert f"alias {CACHE}/blobs/;" in internal
    assert "etag off;" in internal
    for header in ("X-Repo-Commit", "ETag", "X-Linked-Etag", "X-Linked-Size", "X-Mirror-Cache"):
        var = "$upstream_http_" + header.lower().replace("-", "_")
        assert re.search(rf"add_header\s+{header}\s+\{var}\s+always;", internal), header
    assert not re.search(r"max_ranges\s+0;", text)
    for directive in ("proxy_buffering off;", "proxy_request_buffering off;", "proxy_read_timeout"):
        assert directive in text
    for header in ("Host", "X-Forwarded-For", "X-Forwarded-Proto", "Authorization"):
        assert re.search(rf"proxy_set_header\s+{header}\s", text), header


def test_nginx_conf_syntax(tmp_path):
    nginx = _nginx()
    conf = render_nginx_conf(tmp_path / "nginx", mirror_port=8090, listen_port=free_port(), cache_dir=tmp_path)
    proc = nginx_test(conf, nginx)
    assert proc.returncode == 0, proc.stderr
    assert "syntax is ok" in proc.stderr


def test_nginx_tls_snippet_syntax(tmp_path):
    nginx = _nginx()
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("the openssl CLI is not installed (apt-get install openssl)")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    conf = render_nginx_conf(
        tmp_path / "nginx", 8090, free_port(), tmp_path, tls_port=free_port(), certfile=cert, keyfile=key
    )
    assert "hf-mirror-tls.conf;" in conf.read_text()
    proc = nginx_test(conf, nginx)
    assert proc.returncode == 0, proc.stderr


class _FakeMirror(http.server.ThreadingHTTPServer):
    """Answers /accel/* like `serve --accel-redirect` does for a warm blob, and /stream/* with a plain body."""

    daemon_threads = True

    def __init__(self, blob: bytes) -> None:
        self.blob = blob
        self.etag = hashlib.sha256(blob).hexdigest()
        self.seen: list[dict[str, str]] = []
        super().__init__(("127.0.0.1", 0), _FakeMirrorHandler)


class _FakeMirrorHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _FakeMirror

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        srv = self.server
        srv.seen.append(dict(self.headers))
        etag = srv.etag
        self.send_response(200)
        hub = {
            "ETag": f'"{etag}"',
            "X-Repo-Commit": "c" * 40,
            "X-Linked-Etag": f'"{etag}"',
            "X-Linked-Size": str(len(srv.blob)),
            "Content-Disposition": "inline; filename*=UTF-8''model.safetensors; filename=\"model.safetensors\"",
            "X-Mirror-Cache": "hit",
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
        }
        for name, value in hub.items():
            self.send_header(name, value)
        if self.path.startswith("/accel/"):
            self.send_header("X-Accel-Redirect", f"{BLOBS_PREFIX}{etag[:2]}/{etag}")
            self.send_header("Content-Length", "0")
            self.end_headers()
        else:
            self.send_header("Content-Length", str(len(srv.blob)))
            self.end_headers()
            if self.command == "GET":
                self.wfile.write(srv.blob)

    do_HEAD = do_GET


@pytest.fixture()
def front(tmp_path) -> Iterator[tuple[NginxFront, _FakeMirror]]:
    nginx = _nginx()
    blob = os.urandom(300_000)
    mirror = _FakeMirror(blob)
    cache = tmp_path / "cache"
    (cache / "blobs" / mirror.etag[:2]).mkdir(parents=True)
    (cache / "blobs" / mirror.etag[:2] / mirror.etag).write_bytes(blob)
    thread = threading.Thread(target=mirror.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    conf = render_nginx_conf(tmp_path / "nginx", mirror.server_address[1], free_port(), cache)
    try:
        with NginxFront(conf, nginx) as running:
            yield running, mirror
    finally:
        mirror.shutdown()
        mirror.server_close()


def _get(url: str, **headers: str) -> tuple[int, bytes, list[tuple[str, str]]]:
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=10) as resp:
        return resp.status, resp.read(), resp.getheaders()


def _header(headers: list[tuple[str, str]], name: str) -> list[str]:
    return [v for k, v in headers if k.lower() == name.lower()]


def test_nginx_serves_accel_redirect_with_hub_headers(front):
    running, mirror = front
    status, body, headers = _get(running.url + "/accel/gpt2/resolve/main/model.safetensors", Authorization="Bearer t")
    assert status == 200 and body == mirror.blob
    assert _header(headers, "ETag") == [f'"{mirror.etag}"'], "nginx's own mtime-size etag leaked"
    assert _header(headers, "X-Repo-Commit") == ["c" * 40]
    assert _header(headers, "X-Linked-Etag") == [f'"{mirror.etag}"']
    assert _header(headers, "X-Linked-Size") == [str(len(mirror.blob))]
    assert _header(headers, "X-Mirror-Cache") == ["hit"]
    assert _header(headers, "Accept-Ranges") == ["bytes"]
    assert len(_header(headers, "Content-Disposition")) == 1
    assert "model.safetensors" in _header(headers, "Content-Disposition")[0]
    seen = mirror.seen[-1]
    assert seen["Authorization"] == "Bearer t"
    assert seen["X-Forwarded-Proto"] == "http" and seen["X-Forwarded-For"] == "127.0.0.1"
    assert seen["Host"] == f"127.0.0.1:{running.port}"


def test_nginx_answers_range_on_accel_redirect(front):
    running, mirror = front
    status, body, headers = _get(running.url + "/accel/gpt2/resolve/main/model.safetensors", Range="bytes=1000-1999")
    assert status == 206 and body == mirror.blob[1000:2000]
    assert _header(headers, "Content-Range") == [f"bytes 1000-1999/{len(mirror.blob)}"]
    assert _header(headers, "ETag") == [f'"{mirror.etag}"']
    assert _header(headers, "X-Repo-Commit") == ["c" * 40]
    assert _header(headers, "Accept-Ranges") == ["bytes"]
    status, body, _ = _get(running.url + "/accel/gpt2/resolve/main/model.safetensors", Range="bytes=-10")
    assert status == 206 and body == mirror.blob[-10:]


def test_nginx_proxies_plain_bodies_and_hides_blobs(front):
    running, mirror = front
    status, body, headers = _get(running.url + "/stream/model.safetensors")
    assert status == 200 and body == mirror.blob
    assert _header(headers, "X-Mirror-Cache") == ["hit"]
    assert _header(headers, "ETag") == [f'"{mirror.etag}"']
    assert _header(headers, "Accept-Ranges") == ["bytes"]
    # The fake mirror ignores Range on plain bodies; nginx (proxy_force_ranges) still answers 206.
    status, body, headers = _get(running.url + "/stream/model.safetensors", Range="bytes=5-9")
    assert status == 206 and body == mirror.blob[5:10]
    assert _header(headers, "Accept-Ranges") == ["bytes"]
    with pytest.raises(urllib.error.HTTPError) as err:
        _get(f"{running.url}{BLOBS_PREFIX}{mirror.etag[:2]}/{mirror.etag}")
    assert err.value.code == 404, "the blobs location must be internal"
    status, body, _ = _get(running.url + "/nginx-healthz")
    assert status == 200 and body == b"ok\n"


def test_nginx_and_the_mirror_log_one_request_id(front):
    """nginx hands its $request_id to the mirror (which keeps a well-formed X-Request-Id) and logs it as rid=."""
    running, mirror = front
    _get(running.url + "/stream/model.safetensors", **{"X-Request-Id": "from-the-client"})
    sent = mirror.seen[-1].get("X-Request-Id")
    assert sent and sent != "from-the-client", mirror.seen[-1]
    log = running.prefix / "logs" / "access.log"
    deadline = time.monotonic() + 10
    while f"rid={sent}" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert f"rid={sent}" in log.read_text()


# -------------------------------------------------------------------------------------------------------- systemd


def _unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """A systemd unit as {section: {key: [values...]}} (keys may repeat)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"{path}: key outside a section: {line}"
        key, sep, value = line.partition("=")
        assert sep, f"{path}: not KEY=VALUE: {line}"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


HARDENING = {"NoNewPrivileges": "yes", "ProtectSystem": "strict", "ReadWritePaths": CACHE, "PrivateTmp": "yes"}


def test_systemd_server_unit():
    unit = _unit(SYSTEMD / "hf-mirror.service")
    service = unit["Service"]
    argv = shlex.split(service["ExecStart"][-1])
    assert Path(argv[0]).name == "hf-mirror" and argv[1] == "serve"
    assert argv[argv.index("--cache-dir") + 1] == CACHE
    assert service["User"] == ["hfmirror"]
    assert "-/etc/hf-mirror/env" in service["EnvironmentFile"]
    assert service["Restart"] == ["on-failure"]
    assert "TimeoutStopSec" in service
    for key, value in HARDENING.items():
        assert service[key] == [value], key
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]


def test_systemd_sync_units():
    service = _unit(SYSTEMD / "hf-mirror-sync.service")["Service"]
    assert service["Type"] == ["oneshot"]
    argv = shlex.split(service["ExecStart"][-1])
    assert Path(argv[0]).name == "hf-mirror" and argv[1:] == SYNC_CMD[1:]
    assert service["User"] == ["hfmirror"]
    for key, value in HARDENING.items():
        assert service[key] == [value], key
    timer = _unit(SYSTEMD / "hf-mirror-sync.timer")
    assert timer["Timer"]["OnCalendar"] == ["*-*-* 02:00:00"]
    assert timer["Timer"]["Persistent"] == ["true"]
    assert timer["Timer"]["RandomizedDelaySec"]
    assert timer["Timer"].get("Unit", ["hf-mirror-sync.service"]) == ["hf-mirror-sync.service"]
    assert timer["Install"]["WantedBy"] == ["timers.target"]


def test_systemd_analyze_verify(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (units checked structurally above)")
    # verify insists that ExecStart's binary exists: point it at a stub with the same arguments.
    stub = tmp_path / "bin" / "hf-mirror"
    stub.parent.mkdir()
    stub.write_text("#!/bin/sh\nexit 0\n")
    stub.chmod(0o755)
    units = tmp_path / "units"
    units.mkdir()
    for src in sorted(SYSTEMD.glob("hf-mirror*")):
        (units / src.name).write_text(src.read_text().replace("/opt/hf-mirror/bin/hf-mirror", str(stub)))
    proc = subprocess.run(
        [analyze, "verify", *sorted(str(p) for p in units.iterdir())], capture_output=True, text=True, timeout=60
    )
    problems = [line for line in (proc.stdout + proc.stderr).splitlines() if "hf-mirror" in line]
    assert proc.returncode == 0 and not problems, proc.stdout + proc.stderr


# ----------------------------------------------------------------------------------------------------------- cron

_CRON_RANGES = [(0, 59), (0, 23), (1, 31), (1, 12), (0, 7)]


def _check_cron_fields(fields: list[str]) -> None:
    assert len(fields) == 5, fields
    for field, (low, high) in zip(fields, _CRON_RANGES, strict=True):
        for part in field.split(","):
            base, _, step = part.partition("/")
            assert not step or step.isdigit()
            if base == "*":
                continue
            bounds = [int(x) for x in base.split("-")]
            assert all(low <= b <= high for b in bounds), field


def test_cron_line():
    lines = [
        line
        for line in (DEPLOY / "cron" / "hf-mirror-sync").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    jobs = [line for line in lines if not re.match(r"^[A-Z_]+=", line)]
    assert len(jobs) == 1
    fields = jobs[0].split(None, 6)
    _check_cron_fields(fields[:5])
    user, command = fields[5], fields[6]
    assert user == "hfmirror"
    assert "%" not in command, "cron turns % into newlines"
    assert command.startswith("flock -n ")
    assert "hf-mirror sync --manifest /etc/hf-mirror/sync.toml --cache-dir /var/cache/hf-mirror" in command
    assert "." not in (DEPLOY / "cron" / "hf-mirror-sync").name, "cron.d ignores file names with dots"


# ----------------------------------------------------------------------------------------------------------- docs


def test_operations_doc_mentions_every_deploy_file():
    doc = (ROOT / "docs" / "operations.md").read_text()
    for path in sorted(p for p in DEPLOY.rglob("*") if p.is_file()):
        assert str(path.relative_to(ROOT)) in doc, f"docs/operations.md does not mention {path.relative_to(ROOT)}"
    assert "docker-compose.yml" in doc and "kubectl apply -k deploy/k8s" in doc
