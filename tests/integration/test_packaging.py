"""What ``pip install .`` puts on a user's path: one top-level package, ``shardq``, holding
everything the running cluster reads (Lua scripts, migrations, .proto files, typing markers),
and the four console scripts pointing into it.

The repository's files (git's tracked ones and the new ones it does not ignore, as they are in
the working tree) are copied to a fresh folder first, so the editable install's build/ tree and
any stray file of the checkout play no part; the copy is installed into an empty target.
"""

from __future__ import annotations

import ast
import configparser
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.layout import REPO, installed_path, package_dirs, pyproject

SCRIPTS = {"shardq", "shardq-coordinator", "shardq-shard", "shardq-worker"}


def _copy_of_the_repository(dest: Path) -> Path:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        check=True,
        capture_output=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():  # tracked but deleted in the working tree: gone
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


@pytest.fixture(scope="module")
def copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _copy_of_the_repository(tmp_path_factory.mktemp("repo"))


@pytest.fixture(scope="module")
def target(copy: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The copy, installed by pip into an empty folder (as site-packages would hold it)."""
    target = tmp_path_factory.mktemp("site-packages")
    # No build isolation: the venv's setuptools builds it, so no registry is needed.
    pip = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
         "--no-cache-dir", "--target", str(target), str(copy)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )  # fmt: skip
    assert pip.returncode == 0, pip.stderr
    return target


def _dist_info(target: Path) -> Path:
    (dist_info,) = target.glob("shardq-*.dist-info")
    return dist_info


def _installed(target: Path) -> set[str]:
    return {p.relative_to(target).as_posix() for p in target.rglob("*") if p.is_file()}


def test_the_only_top_level_package_installed_is_shardq(target: Path) -> None:
    assert {p.name for p in target.iterdir()} == {"shardq", _dist_info(target).name, "bin"}
    assert (_dist_info(target) / "top_level.txt").read_text().split() == ["shardq"]
    for other in ("coordinator", "shard", "worker", "proto", "tests", "bench", "deploy", "helm"):
        assert not (target / other).exists(), other


def test_the_scripts_folder_holds_only_the_console_scripts(target: Path) -> None:
    assert {p.name for p in (target / "bin").iterdir()} == SCRIPTS


def test_every_file_of_the_package_folders_is_installed(copy: Path, target: Path) -> None:
    """Every module (and stub) of the mapped folders: a folder missing from pyproject.toml's
    ``packages`` would leave its modules out of the install, and the cluster broken."""
    sources = [
        p
        for folder in package_dirs(copy).values()
        for p in folder.rglob("*")
        if p.suffix in (".py", ".pyi") and "__pycache__" not in p.parts
    ]
    assert sources
    installed = _installed(target)
    missing = [p for p in sources if installed_path(copy, p).as_posix() not in installed]
    assert not missing, f"not installed: {sorted(p.relative_to(copy).as_posix() for p in missing)}"


#: What the running cluster reads besides modules: (what, globs in the repository).
RUNTIME_FILES = [
    ("the shard's Lua scripts", ["shard/lua/*.lua"]),
    (
        "the alembic environment, template and config",
        [f"proto/shardq/store/migrations/{n}" for n in ("env.py", "script.py.mako", "alembic.ini")],
    ),
    ("the migration versions", ["proto/shardq/store/migrations/versions/*.py"]),
    ("the API's .proto files", ["proto/shardq/v1/*.proto"]),
    (
        "the py.typed markers",
        [
            "proto/shardq/py.typed",
            "proto/shardq/v1/py.typed",
            "coordinator/py.typed",
            "shard/py.typed",
            "worker/py.typed",
        ],
    ),
]


@pytest.mark.parametrize(("what", "globs"), [pytest.param(w, g, id=w) for w, g in RUNTIME_FILES])
def test_the_files_the_cluster_reads_at_runtime_are_installed(
    copy: Path, target: Path, what: str, globs: list[str]
) -> None:
    installed = _installed(target)
    for pattern in globs:
        sources = sorted(copy.glob(pattern))
        assert sources, f"{pattern} matches nothing in the repository"
        for source in sources:
            assert installed_path(copy, source).as_posix() in installed, source


def test_the_four_console_scripts_point_at_functions_inside_shardq(
    copy: Path, target: Path
) -> None:
    entry_points = configparser.ConfigParser()
    entry_points.read(_dist_info(target) / "entry_points.txt")
    scripts = dict(entry_points["console_scripts"])
    assert set(scripts) == SCRIPTS
    assert scripts == pyproject(copy)["project"]["scripts"]
    for name, value in scripts.items():
        module, _, function = value.partition(":")
        assert module.startswith("shardq."), (name, value)
        path = target.joinpath(*module.split("."))
        source = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        assert source.is_file(), (name, value)
        defined = {
            n.name
            for n in ast.parse(source.read_text()).body
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
        }
        assert function in defined, (name, value)
        assert f"from {module} import {function}" in (target / "bin" / name).read_text()


#: Run by the venv's interpreter from an empty folder, with only the installed copy ahead of
#: the venv's site-packages: no repository folder can stand in for a module, a Lua script or
#: a migration the way the checkout does while the rest of the suite runs from its root.
_IMPORT_EVERYTHING = """
import pkgutil, sys
from pathlib import Path
import shardq
assert Path(shardq.__file__).resolve().is_relative_to(Path(sys.argv[1]).resolve()), shardq.__file__
names = [m.name for m in pkgutil.walk_packages(shardq.__path__, "shardq.")]
for name in names:
    # __main__ modules would start the programs; migrations run only inside alembic.
    if not name.endswith("__main__") and ".migrations" not in name:
        __import__(name)
from shardq.shard import scripts
for name in scripts.SCRIPT_NAMES:
    assert scripts.source(name).strip(), name
from shardq.store import migrate
assert (migrate.MIGRATIONS_DIR / "env.py").is_file()
assert migrate.head_revision()
print(len(names))
"""


def test_the_installed_copy_imports_and_loads_its_files_outside_the_repository(
    target: Path, tmp_path: Path
) -> None:
    run = subprocess.run(
        [sys.executable, "-c", _IMPORT_EVERYTHING, str(target)],
        cwd=tmp_path,
        env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert int(run.stdout) > 50
