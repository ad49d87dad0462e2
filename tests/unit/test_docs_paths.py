"""The docs name files, classes and methods of the code: each name must still exist (a rename leaves no dangling
reference in docs/*.md or README.md), and the layer picture of mirror/__init__.py names every package that
tests/unit/test_layers.py holds to a layer. Read with ``ast`` and regular expressions; nothing is imported."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

from tests.unit.test_layers import LAYERS

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]

# `mirror/cache/manager.py`, `tests/unit/test_layers.py`, or (in docs/architecture.md's walk) `service/files.py`.
CODE_PATH = re.compile(r"`([A-Za-z0-9_./-]+\.py)`")
# mirror/x/y.py anywhere, backticked or not.
MIRROR_PATH = re.compile(r"(?<![\w/.-])(mirror/[A-Za-z0-9_/]+\.py)\b")
# `FileService.resolve_file` or `CacheManager.make_room(...)`: a class of the package and one of its members.
MEMBER = re.compile(r"`([A-Z][A-Za-z0-9]+)\.([a-z_][a-z0-9_]*)[`(]")


# The project's own trees: a path under one of them must exist. A path under none (`utils/_http.py`) is a library's.
OWN_TREES = ("mirror", "tests", "bench", "deploy", "docs")


@functools.cache
def _own_basenames() -> frozenset[str]:
    return frozenset(p.name for tree in ("mirror", "tests", "bench") for p in (ROOT / tree).rglob("*.py")
                     if "node_modules" not in p.parts)


def _dangling_path(text: str, basenames: frozenset[str]) -> bool:
    if "/" not in text:  # a bare name (`client.py`, `test_xet.py`): some file of the project has it
        return text not in basenames
    if (ROOT / text).exists() or (ROOT / "mirror" / text).exists():  # `service/files.py`: under mirror/
        return False
    return text.split("/")[0] in OWN_TREES or (ROOT / "mirror" / text.split("/")[0]).is_dir()


def dangling_paths(doc: Path) -> list[str]:
    found = []
    basenames = _own_basenames()
    for number, line in enumerate(doc.read_text().splitlines(), 1):
        names = {m.group(1) for m in CODE_PATH.finditer(line)} | {m.group(1) for m in MIRROR_PATH.finditer(line)}
        found += [f"{doc.name}:{number} {name}" for name in sorted(names) if _dangling_path(name, basenames)]
    return found


def test_every_python_path_in_the_docs_exists() -> None:
    dangling = [hit for doc in DOCS for hit in dangling_paths(doc)]
    assert not dangling, f"these paths are named in the docs but are not in the tree: {dangling}"


@functools.cache
def class_members() -> dict[str, set[str]]:
    """Every class of the package with the names it defines (methods, class attributes, ``self.x`` assignments),
    its bases' (by name, within the package) included."""
    own: dict[str, set[str]] = {}
    bases: dict[str, list[str]] = {}
    for path in sorted((ROOT / "mirror").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ClassDef):
                continue
            names = own.setdefault(node.name, set())
            bases.setdefault(node.name, []).extend(ast.unparse(b).rpartition(".")[2] for b in node.bases)
            for item in ast.walk(node):
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    names.add(item.name)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    names.add(item.target.id)
                elif isinstance(item, ast.Assign):
                    names.update(t.id for t in item.targets if isinstance(t, ast.Name))
                elif (isinstance(item, ast.Attribute) and isinstance(item.value, ast.Name)
                      and item.value.id == "self"):
                    names.add(item.attr)

    def members(name: str, seen: frozenset[str] = frozenset()) -> set[str]:
        found = set(own.get(name, ()))
        for base in bases.get(name, ()):
            if base in own and base not in seen:
                found |= members(base, seen | {name})
        return found

    return {name: members(name) for name in own}


def test_every_class_member_named_in_the_docs_exists() -> None:
    """`Class.member` for a class of the package (a library's class, `HfApi.x`, is not the package's to check)."""
    classes = class_members()
    missing = [f"{doc.name}:{number} {m.group(1)}.{m.group(2)}"
               for doc in DOCS for number, line in enumerate(doc.read_text().splitlines(), 1)
               for m in MEMBER.finditer(line)
               if m.group(1) in classes and m.group(2) not in classes[m.group(1)]]
    assert not missing, f"the docs name members these classes no longer have: {missing}"


def test_the_rules_find_a_dangling_name(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text("See `mirror/service/gone.py` and mirror/layout.py, `service/files.py`, `tests/nope.py`,\n"
                   "`fill/gone.py`, `gone_module.py`, `client.py`, huggingface_hub's `utils/_http.py`.\n")
    assert dangling_paths(doc) == ["doc.md:1 mirror/service/gone.py", "doc.md:1 tests/nope.py",
                                   "doc.md:2 fill/gone.py", "doc.md:2 gone_module.py"]
    assert "resolve_file" in class_members()["FileService"]
    assert "current_snapshot" in class_members()["CacheManager"]  # inherited from UsageReports


def _short(package: str) -> str:
    return package.rpartition(".")[2]


def test_the_layer_pictures_name_every_package() -> None:
    """mirror/__init__.py's docstring and docs/architecture.md's picture name each package of LAYERS."""
    docstring = ast.get_docstring(ast.parse((ROOT / "mirror" / "__init__.py").read_text())) or ""
    architecture = (ROOT / "docs" / "architecture.md").read_text()
    picture = architecture.split("```", 2)[1]
    missing_doc = [p for _, packages in LAYERS for p in packages
                   if p != "mirror.__main__" and not re.search(rf"\b{_short(p)}\b", docstring)]
    missing_pic = [p for _, packages in LAYERS for p in packages
                   if p != "mirror.__main__" and not re.search(rf"\b{_short(p)}(\.py|/)", picture)]
    assert not missing_doc, f"mirror/__init__.py's layer picture leaves out {missing_doc}"
    assert not missing_pic, f"docs/architecture.md's layer picture leaves out {missing_pic}"
    for title, _ in LAYERS:
        assert title in docstring and title in picture, title
