"""The import graph of the ``mirror`` package, read with ``ast`` (nothing is imported): no cycles, nothing below the
CLI imports it, and no function-local imports of the project's own modules except the few allowed below.

Settings come down from the CLI as an argument (``run(args, settings)``) and every command builds its parts with
the one wiring, :func:`mirror.parts.build_parts`; a function-local import would hide a cycle or an upward reach.
"""

from __future__ import annotations

import ast
import builtins
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "mirror"

# (importer, imported) -> why the import sits inside a function. Keep this list short and every reason true.
LOCAL_IMPORTS_ALLOWED = {
    ("mirror.storage", "mirror.storage.s3"):
        "aiobotocore is the optional s3 extra: only storage = 's3' imports it",
    ("mirror.metadata", "mirror.metadata.postgres"):
        "psycopg is the optional fleet extra: only metadata_url imports it",
    ("mirror.cli.sbom", "mirror.audit.sbom"):
        "only `sbom` loads cyclonedx-python-lib and jsonschema; the other commands start without them",
    ("mirror.cli.serve", "mirror.server"):
        "only `serve` loads the server stack (uvicorn, FastAPI: ~0.5 s); `cache` and `sync` start without it",
}


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    line: int
    local: bool  # inside a function body
    typing_only: bool  # under ``if TYPE_CHECKING:``


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(name: str, path: Path, known: set[str]) -> list[Import]:
    """Every import of a ``mirror`` module in ``path``, with where it sits."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[Import] = []

    def target(module: str, names: list[str]) -> list[str]:
        # ``from mirror import hf`` imports the submodule mirror.hf; ``from mirror.fill import X`` imports mirror.fill.
        subs = [f"{module}.{n}" for n in names if f"{module}.{n}" in known]
        return subs + ([module] if len(subs) < len(names) else [])

    def visit(node: ast.AST, local: bool, typing_only: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(child, True, typing_only)
                continue
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    visit(ast.Module(body=[stmt], type_ignores=[]), local, True)
                for stmt in child.orelse:
                    visit(ast.Module(body=[stmt], type_ignores=[]), local, typing_only)
                continue
            targets: list[str] = []
            if isinstance(child, ast.Import):
                targets = [a.name for a in child.names if a.name == "mirror" or a.name.startswith("mirror.")]
            elif isinstance(child, ast.ImportFrom):
                module = child.module or ""
                if child.level:
                    base = package.split(".")[: len(package.split(".")) - child.level + 1]
                    module = ".".join(base + ([module] if module else []))
                if module == "mirror" or module.startswith("mirror."):
                    targets = target(module, [a.name for a in child.names])
            elif (isinstance(child, ast.Call) and child.args and isinstance(child.args[0], ast.Constant)
                  and isinstance(child.args[0].value, str) and child.args[0].value.startswith("mirror")
                  and ast.unparse(child.func) in ("importlib.import_module", "import_module", "__import__")):
                targets = [child.args[0].value]  # a dynamic import is an import too
            for imported in targets:
                if imported != name:
                    found.append(Import(name, imported, child.lineno, local, typing_only))
            visit(child, local, typing_only)

    visit(ast.parse(path.read_text(), str(path)), False, False)
    return found


def all_imports() -> list[Import]:
    mods = modules()
    return [imp for name, path in mods.items() for imp in imports_of(name, path, set(mods))]


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (a list of modules, first == last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state and (cycle := visit(start)) is not None:
            return cycle
    return None


def test_the_reader_sees_the_package() -> None:
    imports = all_imports()
    names = set(modules())
    assert {"mirror.app", "mirror.cli", "mirror.parts", "mirror.sync", "mirror.cli.cache"} <= names
    assert any(i.importer == "mirror.app" and i.imported == "mirror.parts" for i in imports)
    assert all(i.imported in names for i in imports), sorted({i.imported for i in imports} - names)


def test_no_import_cycles() -> None:
    """Module-level, function-level and type-only imports alike: a cycle hidden in a function is still a cycle."""
    edges: dict[str, set[str]] = {}
    for imp in all_imports():
        edges.setdefault(imp.importer, set()).add(imp.imported)
    cycle = find_cycle(edges)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_find_cycle_finds_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}}) is None


def _in_cli(name: str) -> bool:
    return name == "mirror.cli" or name.startswith("mirror.cli.")


def test_nothing_below_the_cli_imports_it() -> None:
    offenders = [f"{i.importer}:{i.line}" for i in all_imports()
                 if _in_cli(i.imported) and not _in_cli(i.importer) and i.importer != "mirror.__main__"]
    assert not offenders, f"settings come down as an argument; these import mirror.cli: {offenders}"


def test_no_function_local_imports_of_the_project() -> None:
    local = [i for i in all_imports() if i.local]
    unexplained = [f"{i.importer}:{i.line} imports {i.imported}" for i in local
                   if (i.importer, i.imported) not in LOCAL_IMPORTS_ALLOWED]
    assert not unexplained, ("import these at the top of the module (or, for an optional extra, add the pair to "
                             f"LOCAL_IMPORTS_ALLOWED with the reason): {unexplained}")
    stale = set(LOCAL_IMPORTS_ALLOWED) - {(i.importer, i.imported) for i in local}
    assert not stale, f"LOCAL_IMPORTS_ALLOWED names imports that are no longer local: {sorted(stale)}"


# --- layers: routes send what the service decided; policy speaks no HTTP ---------------------------------------------

ROUTES = "mirror.routes"
POLICY = ("mirror.service", "mirror.access", "mirror.fill", "mirror.admission")  # and their submodules
WEB_AND_HTTP = ("fastapi", "starlette", "uvicorn", "httpx", "urllib3", "h11", "httptools")
# Clients of HTTP in their own right (a mirror's API over HTTP, a benchmark driver, the demo): beside the server's
# layers, not under them. Inside the server, only the upstream adapter speaks HTTP to others.
HTTP_CLIENTS_ALLOWED = ("mirror.upstream", "mirror.sync", "mirror.harness", "mirror.demo")


def _within(name: str, packages: tuple[str, ...] | str) -> bool:
    packages = (packages,) if isinstance(packages, str) else packages
    return any(name == p or name.startswith(p + ".") for p in packages)


def external_imports(path: Path) -> set[str]:
    """The top-level names of the libraries a module imports, anywhere in it (function bodies included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found - {"mirror"}


def test_routes_never_touch_upstream_store_or_index() -> None:
    """A route turns the service's answer (Cached | Filling | Relay, an ApiResult) into bytes on the wire; what to
    fetch, relay or store is the service's decision (as Docker distribution's proxy blob store decides to relay)."""
    offenders = [f"{i.importer}:{i.line} imports {i.imported}" for i in all_imports()
                 if _within(i.importer, ROUTES)
                 and _within(i.imported, ("mirror.upstream", "mirror.storage", "mirror.index"))]
    assert not offenders, f"routes go through mirror.service (or read a fill of mirror.fill): {offenders}"


# The services a route asks (mirror.service's MirrorService, mirror.viewer's ViewerService): a route calls their methods
# and reads their answers; it never reaches a part they hold (``self.service.index.get_ref``,
# ``service.upstream.base``), nor a side the service is composed of (``self.service.file_service.index``,
# ``self.service.core.probes``).
SERVICES = ("mirror.service", "mirror.viewer.service")
# What MirrorService holds as attributes (its core and the sides built over it) and shows as properties (parts of the
# core a route may test for None, never reach through): a chain through any of them is a chain through a part.
SERVICE_PARTS = {"core", "file_service", "api_service", "read_service", "admission", "xet"}


def service_methods() -> set[str]:
    """Every method of the classes of the service modules (a property is a part, not a method)."""
    names: set[str] = set()
    for name, path in modules().items():
        if _within(name, SERVICES):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ClassDef):
                    names |= {item.name for item in node.body
                              if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                              and not any(isinstance(d, ast.Name) and d.id == "property" for d in item.decorator_list)}
    return names


def service_chains(source: str, methods: set[str]) -> list[str]:
    """``service.<part>.<attr>`` and ``self.service.<part>.<attr>`` in ``source`` where ``<part>`` is no method."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)):
            continue
        holder = node.value.value
        is_service = (isinstance(holder, ast.Name) and holder.id == "service") or (
            isinstance(holder, ast.Attribute) and holder.attr == "service" and isinstance(holder.value, ast.Name)
            and holder.value.id == "self")
        if is_service and node.value.attr not in methods:
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_routes_reach_no_part_through_the_service() -> None:
    """A route asks the service (a method) and sends its answer; the service's parts (index, upstream, store, fills)
    stay private to it: an attribute chain through the service is knowledge leaking past the import graph."""
    methods = service_methods()
    assert {"resolve_file", "open_blob", "open_xorb", "commit_of", "pointed_at"} <= methods
    assert not SERVICE_PARTS & methods, "a part of the service named like a method would let a chain through it pass"
    offenders = {name: chains for name, path in modules().items() if _within(name, ROUTES)
                 if (chains := service_chains(path.read_text(), methods))}
    assert not offenders, f"give the service a method for what these routes reach through it: {offenders}"


def test_the_service_chain_rule_finds_one() -> None:
    methods = {"commit_of"}
    assert service_chains("x = self.service.index.get_ref(repo, rev)", methods) == [
        "1: self.service.index.get_ref"]
    assert service_chains("y = service.upstream.upstream.base", methods) == ["1: service.upstream.upstream"]
    assert service_chains("z = self.service.commit_of(repo, rev).upper()", methods) == []
    assert service_chains("w = self.service.file_service.index", methods) == ["1: self.service.file_service.index"]
    assert service_chains("v = self.service.admission is None", methods) == []


def test_policy_imports_no_web_framework_or_http_client() -> None:
    """The service, the fill engine and the access policy return values; upstream bytes reach them as the values
    of mirror.upstream, never as a transport's response objects."""
    offenders = {name: sorted(external_imports(path) & set(WEB_AND_HTTP))
                 for name, path in modules().items() if _within(name, POLICY)}
    offenders = {name: libs for name, libs in offenders.items() if libs}
    assert not offenders, f"policy modules import a web framework or an HTTP client: {offenders}"


def test_only_the_upstream_adapter_speaks_http_inside_the_server() -> None:
    offenders = {name: sorted(external_imports(path) & {"httpx", "urllib3"})
                 for name, path in modules().items() if not _within(name, HTTP_CLIENTS_ALLOWED)}
    offenders = {name: libs for name, libs in offenders.items() if libs}
    assert not offenders, f"only mirror.upstream talks HTTP to other servers: {offenders}"


def test_the_layer_rules_see_their_modules() -> None:
    """The rules above check something: the packages they name exist and hold the modules they are about."""
    names = set(modules())
    assert {"mirror.routes.resolve", "mirror.routes.peer", "mirror.service", "mirror.access",
            "mirror.fill.manager", "mirror.upstream.client"} <= names
    assert "httpx" in external_imports(modules()["mirror.upstream.client"])
    assert "fastapi" in external_imports(modules()["mirror.app"])


# --- the layers (mirror/__init__.py draws them): each module imports only from its own layer or below ---------------

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("values and the wire contract", ("mirror.config", "mirror.errors", "mirror.hf", "mirror.hubjson",
                                      "mirror.integrity", "mirror.metrics", "mirror.logs", "mirror.asgi",
                                      "mirror.routetable", "mirror.layout")),
    ("adapters", ("mirror.index", "mirror.storage", "mirror.metadata", "mirror.upstream")),
    ("policy", ("mirror.access", "mirror.admission", "mirror.auth", "mirror.fill", "mirror.service", "mirror.viewer",
                "mirror.xet")),
    ("edges", ("mirror.routes", "mirror.sync", "mirror.cache", "mirror.status", "mirror.audit")),
    ("the one wiring", ("mirror.parts", "mirror.app", "mirror.front", "mirror.server")),
    ("the CLI", ("mirror.cli", "mirror.__main__")),
)
# Beside the house, over HTTP only: they start a server as a process or talk to one, never import its internals.
SIDE = ("mirror.harness", "mirror.demo")


def layer_of(name: str) -> int | None:
    for number, (_, packages) in enumerate(LAYERS):
        if _within(name, packages):
            return number
    return None


def test_every_module_has_a_layer() -> None:
    homeless = [name for name in modules() if name != "mirror" and layer_of(name) is None and not _within(name, SIDE)]
    assert not homeless, f"give these modules a layer in LAYERS (and in mirror/__init__.py): {homeless}"


def test_layers_import_downward_only() -> None:
    upward = []
    for imp in all_imports():
        if imp.importer == "mirror" or imp.imported == "mirror":
            continue
        if _within(imp.importer, SIDE):
            continue
        low, high = layer_of(imp.importer), layer_of(imp.imported)
        if low is not None and high is not None and high > low:
            upward.append(f"{imp.importer}:{imp.line} ({LAYERS[low][0]}) imports {imp.imported} ({LAYERS[high][0]})")
    assert not upward, "\n".join(upward)


def test_the_side_tools_reach_the_server_over_http_only() -> None:
    server_internals = [imp for imp in all_imports() if _within(imp.importer, SIDE) and layer_of(imp.imported) in
                        (1, 2, 3, 4)]
    assert not server_internals, [f"{i.importer}:{i.line} imports {i.imported}" for i in server_internals]


# --- one exception tree (errors.py draws it, as httpx's _exceptions.py does) ---------------------------------------

def _exception_names() -> set[str]:
    tree = ast.parse(modules()["mirror.errors"].read_text())
    names = {name for name in dir(builtins) if isinstance(getattr(builtins, name), type)
             and issubclass(getattr(builtins, name), BaseException)}
    return names | {node.name for node in tree.body if isinstance(node, ast.ClassDef)}


def test_every_exception_of_the_server_is_in_errors() -> None:
    known = _exception_names()
    offenders = [f"{name}:{node.lineno} {node.name}" for name, path in modules().items()
                 if name != "mirror.errors" and not _within(name, SIDE)
                 for node in ast.walk(ast.parse(path.read_text(), str(path)))
                 if isinstance(node, ast.ClassDef) and any(ast.unparse(b).rpartition(".")[2] in known
                                                           for b in node.bases)]
    assert not offenders, f"define these in mirror/errors.py (its tree, drawn in its docstring): {offenders}"
