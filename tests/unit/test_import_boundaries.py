"""Who may import whom inside shardq, checked on the source as it lies in the repository.

The folders install under other names (pyproject.toml's ``package-dir``: ``shard/`` is
``shardq.shard``, ``proto/shardq/`` is ``shardq`` ...), so each file is first given its
installed module name with that same mapping, read from pyproject.toml
(:mod:`tests.support.layout`). Every import is then read with ``ast``: at module level, inside
functions and under ``if TYPE_CHECKING``; relative imports are resolved against the importing
module; ``from pkg import Name`` also counts as importing the module that ``pkg/__init__.py``
takes ``Name`` from (the root's lazy ``shardq.Client``); a literal
``importlib.import_module("...")`` counts too. The generated ``*_pb2*.py`` are left out.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.layout import REPO, module_files, setuptools_config

#: importing package -> the packages it must not import (each with everything below it).
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "shardq.shard": ("shardq.coordinator", "shardq.worker", "shardq.client"),
    "shardq.worker": ("shardq.coordinator", "shardq.client"),
    "shardq.coordinator": ("shardq.worker",),
    "shardq.common": (
        "shardq.coordinator", "shardq.shard", "shardq.worker", "shardq.store", "shardq.client",
    ),
    "shardq.store": ("shardq.coordinator", "shardq.shard", "shardq.worker", "shardq.client"),
    "shardq.client": ("shardq.coordinator", "shardq.shard", "shardq.worker", "shardq.store"),
}  # fmt: skip
#: The dashboard is a client of the API, like any service: besides itself it may import only
#: shardq.client, shardq.v1 and shardq.common, none of the coordinator it talks to over gRPC.
FORBIDDEN["shardq.coordinator.dashboard"] = (
    "shardq.shard",
    "shardq.worker",
    "shardq.store",
    *sorted(
        f"shardq.coordinator.{p.stem}"
        for p in (REPO / "coordinator").iterdir()
        if p.stem != "dashboard"
        and not p.name.startswith(("_", "."))
        and (p.suffix == ".py" or p.is_dir())
    ),
)
#: The names the folders had before they moved under shardq: no module may import them.
OLD_TOP_LEVEL = ("coordinator", "shard", "worker")


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


@dataclass(frozen=True)
class Violation:
    file: str  # relative to the tree's root
    line: int
    imported: str
    rule: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: imports {self.imported} ({self.rule})"


# --- what a module imports -------------------------------------------------------------------


@dataclass(frozen=True)
class _Import:
    line: int
    #: Each name this statement may load, the first forbidden one is reported.
    candidates: tuple[str, ...]


def _resolve(module: str, is_package: bool, level: int, name: str | None) -> str:
    """The absolute name of ``from {'.' * level}{name} import ...`` written in ``module``."""
    if level == 0:
        return name or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    if level - 1 >= len(base):
        raise ValueError(module)
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, name] if name else base)


def _imports(tree: ast.Module, module: str, is_package: bool) -> Iterator[_Import | Violation]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield _Import(node.lineno, (alias.name,))
        elif isinstance(node, ast.ImportFrom):
            try:
                base = _resolve(module, is_package, node.level, node.module)
            except ValueError:
                relative = "." * node.level + (node.module or "")
                yield Violation("", node.lineno, relative, "relative import beyond shardq")
                continue
            names = tuple(f"{base}.{a.name}" for a in node.names if a.name != "*")
            yield _Import(node.lineno, (base, *names))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id)
            == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and not node.args[0].value.startswith(".")
        ):
            yield _Import(node.lineno, (node.args[0].value,))


def _reexports(trees: dict[str, tuple[ast.Module, bool]]) -> dict[str, tuple[str, ...]]:
    """``pkg.Name`` -> the modules ``pkg/__init__.py`` may take ``Name`` from."""
    out: dict[str, tuple[str, ...]] = {}
    for module, (tree, is_package) in trees.items():
        if not is_package:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                try:
                    base = _resolve(module, True, node.level, node.module)
                except ValueError:
                    continue
                for a in node.names:
                    out[f"{module}.{a.asname or a.name}"] = (base, f"{base}.{a.name}")
    return out


def _broken_rule(importer: str, imported: str) -> str | None:
    if imported.split(".", maxsplit=1)[0] in OLD_TOP_LEVEL:
        return "the old top-level name; it is shardq." + imported
    for package, forbidden in FORBIDDEN.items():
        if _within(importer, package):
            for other in forbidden:
                if _within(imported, other):
                    return f"{package} must not import {other}"
    return None


def violations(root: Path) -> list[Violation]:
    """Every import in the tree under ``root`` that crosses a boundary, in file and line order."""
    files = module_files(root)
    trees = {
        module: (ast.parse(path.read_text(), str(path)), path.name == "__init__.py")
        for module, path in files.items()
    }
    reexports = _reexports(trees)
    out: list[Violation] = []
    for module, (tree, is_package) in trees.items():
        file = files[module].relative_to(root).as_posix()
        for found in _imports(tree, module, is_package):
            if isinstance(found, Violation):
                out.append(Violation(file, found.line, found.imported, found.rule))
                continue
            names = [n for c in found.candidates for n in (c, *reexports.get(c, ()))]
            for name in names:
                rule = _broken_rule(module, name)
                if rule is not None:
                    out.append(Violation(file, found.line, name, rule))
                    break
    return sorted(out, key=lambda v: (v.file, v.line, v.imported))


# --- the package as it is --------------------------------------------------------------------


def test_no_module_of_the_package_imports_across_a_boundary() -> None:
    found = violations(REPO)
    assert not found, "imports across a boundary:\n" + "\n".join(map(str, found))


def test_every_package_the_project_installs_is_read_under_its_installed_name() -> None:
    packages = setuptools_config(REPO)["packages"]
    modules = module_files(REPO)
    assert set(packages) <= set(modules), set(packages) - set(modules)
    for name in ("shardq.client", "shardq.shard.client", "shardq.worker.runtime"):
        assert name in modules, name
    assert modules["shardq.coordinator.api"] == REPO / "coordinator" / "api.py"
    assert modules["shardq.common"] == REPO / "proto" / "shardq" / "common" / "__init__.py"
    assert not [m for m in modules if "_pb2" in m]


# --- the checker itself, on a tree made to break every rule -----------------------------------

#: (file, source whose last line is the import, the module reported). Each line breaks one rule.
BREAKS: list[tuple[str, str, str]] = [
    # shardq.shard
    ("shard/a.py", "import shardq.coordinator.api", "shardq.coordinator.api"),
    ("shard/a.py", "from shardq.worker import runtime", "shardq.worker"),
    ("shard/a.py", "from shardq.client import Client", "shardq.client"),
    ("shard/a.py", "from shardq import Client  # the root's re-export", "shardq.client"),
    ("shard/sub/__init__.py", "from ...client import Client", "shardq.client"),
    # shardq.worker
    ("worker/a.py", "def f():\n    from shardq.coordinator import api", "shardq.coordinator"),
    ("worker/a.py", "if TYPE_CHECKING:\n    import shardq.client", "shardq.client"),
    # shardq.coordinator
    ("coordinator/a.py", "from ..worker import runtime", "shardq.worker"),
    ("coordinator/a.py", "importlib.import_module('shardq.worker.x')", "shardq.worker.x"),
    # shardq.coordinator.dashboard: a client of the API
    ("coordinator/dashboard/a.py", "from ..router import R", "shardq.coordinator.router"),
    ("coordinator/dashboard/a.py", "from shardq.shard import keys", "shardq.shard"),
    # shardq.common
    ("proto/shardq/common/a.py", "from shardq import coordinator", "shardq.coordinator"),
    ("proto/shardq/common/a.py", "from .. import shard", "shardq.shard"),
    ("proto/shardq/common/a.py", "import shardq.worker as w", "shardq.worker"),
    ("proto/shardq/common/a.py", "from ..store.results import R", "shardq.store.results"),
    ("proto/shardq/common/a.py", "from shardq.client import Client", "shardq.client"),
    # shardq.store
    ("proto/shardq/store/a.py", "from shardq.coordinator.api import X", "shardq.coordinator.api"),
    ("proto/shardq/store/a.py", "from ..shard import keys", "shardq.shard"),
    ("proto/shardq/store/a.py", "class C:\n def m(s):\n  import shardq.worker", "shardq.worker"),
    ("proto/shardq/store/a.py", "from shardq import client", "shardq.client"),
    # shardq.client
    ("proto/shardq/client.py", "from shardq.coordinator import convert", "shardq.coordinator"),
    ("proto/shardq/client.py", "from .shard import ShardClient", "shardq.shard"),
    ("proto/shardq/client.py", "from .worker import handler", "shardq.worker"),
    ("proto/shardq/client.py", "from shardq.store.db import x", "shardq.store.db"),
    # the old top-level names, from anywhere
    ("coordinator/b.py", "import coordinator.api", "coordinator.api"),
    ("proto/shardq/v1/__init__.py", "from shard import ShardClient", "shard"),
    ("worker/b.py", "from worker.runtime import run", "worker.runtime"),
    # a relative import that climbs out of shardq
    ("proto/shardq/common/b.py", "from ... import x", "..."),
]  # fmt: skip

#: Imports that cross no boundary: none of them may be reported.
ALLOWED: list[tuple[str, str]] = [
    ("coordinator/dashboard/b.py", "from shardq.client import AsyncClient"),
    ("coordinator/dashboard/b.py", "from shardq.coordinator.dashboard.api import Api"),
    ("shard/b.py", "from shardq.common.errors import NotFound"),
    ("shard/b.py", "from .keys import Keys"),
    ("shard/b.py", "import shardq.clientele  # only starts like shardq.client"),
    ("shard/b.py", "import sharding, workers"),
    ("coordinator/c.py", "from shardq.shard import ShardClient"),
    ("coordinator/c.py", "from shardq.store import results"),
    ("coordinator/c.py", "from shardq import client"),
    ("worker/c.py", "from shardq.store.results import ResultsStore"),
    ("worker/c.py", "from ..shard import ShardClient"),
    ("worker/c.py", "importlib.import_module(path)"),
    ("proto/shardq/common/c.py", "from . import clock"),
    ("proto/shardq/store/c.py", "from ..common import errors"),
    ("proto/shardq/v1/__init__.py", "from shardq.v1 import jobs_pb2"),
    ("proto/shardq/v1/jobs_pb2.py", "import coordinator  # generated: not read"),
    ("proto/shardq/__init__.py", "if TYPE_CHECKING:\n    from shardq.client import Client"),
]


def _write_tree(root: Path, rows: list[tuple[str, str]]) -> dict[int, tuple[str, int]]:
    """Write each row's source into its file, in order; row index -> (file, line of its end)."""
    (root / "pyproject.toml").write_bytes((REPO / "pyproject.toml").read_bytes())
    texts: dict[str, list[str]] = {}
    where: dict[int, tuple[str, int]] = {}
    for i, (file, source) in enumerate(rows):
        lines = texts.setdefault(file, [])
        lines += source.splitlines()
        where[i] = (file, len(lines))
    for file, lines in texts.items():
        path = root / file
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n")
    return where


def test_the_checker_reports_every_kind_of_break_with_its_file_line_and_module(
    tmp_path: Path,
) -> None:
    where = _write_tree(tmp_path, [(f, s) for f, s, _ in BREAKS] + ALLOWED)
    got = {(v.file, v.line, v.imported) for v in violations(tmp_path)}
    want = {(*where[i], imported) for i, (_, _, imported) in enumerate(BREAKS)}
    assert got == want, f"missed {sorted(want - got)}, wrongly reported {sorted(got - want)}"


@pytest.mark.parametrize(
    ("file", "source", "imported"),
    BREAKS,
    ids=[
        f"{f.removeprefix('proto/')}:{s.splitlines()[-1].split('#')[0].strip()}"
        for f, s, _ in BREAKS
    ],
)
def test_each_break_among_allowed_imports_is_reported_alone(
    tmp_path: Path, file: str, source: str, imported: str
) -> None:
    where = _write_tree(tmp_path, [(file, source), *ALLOWED])
    assert [(v.file, v.line, v.imported) for v in violations(tmp_path)] == [(*where[0], imported)]


def test_a_violation_names_its_file_line_module_and_rule(tmp_path: Path) -> None:
    _write_tree(tmp_path, [("shard/a.py", '"""Doc."""\nfrom shardq.worker import runtime')])
    (found,) = violations(tmp_path)
    assert str(found) == (
        "shard/a.py:2: imports shardq.worker (shardq.shard must not import shardq.worker)"
    )
