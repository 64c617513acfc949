"""What ``pip install .`` puts on a user's path: one top-level package, ``shardq``, holding
everything the running cluster reads (Lua scripts, migrations, .proto files, typing markers),
and the four console scripts pointing into it; and what the bare ``pip install shardq`` (no
extra) is: the client alone, which submits a job to a real cluster.

The repository's files (git's tracked ones and the new ones it does not ignore, as they are in
the working tree) are copied to a fresh folder first, so the editable install's build/ tree and
any stray file of the checkout play no part; the copy is installed into an empty target.
"""

from __future__ import annotations

import ast
import asyncio
import configparser
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.support.cluster import running_cluster
from tests.support.layout import REPO, installed_path, package_dirs, pyproject
from tests.support.workers import running_worker, shard_loops

#: The console scripts: the four programs, and any other pyproject.toml declares (each named
#: shardq-*, so none can shadow another tool on a user's PATH).
SCRIPTS = {"shardq", "shardq-coordinator", "shardq-shard", "shardq-worker"} | {
    name for name in pyproject(REPO)["project"]["scripts"] if name.startswith("shardq-")
}


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


# --- the bare install: `pip install shardq`, the client alone --------------------------------

#: The distributions a bare install may hold: the client's dependencies (pyproject.toml's
#: ``dependencies``) and theirs. Anything else is weight a service that submits jobs carries.
BARE_DISTRIBUTIONS = {
    "shardq", "grpcio", "grpcio-status", "googleapis-common-protos", "protobuf",
    "typing-extensions",
}  # fmt: skip
#: What the extras bring, which a bare install must not.
SERVER_MODULES = ("sqlalchemy", "redis", "pgserver", "rich", "alembic", "psycopg", "mmh3")


def _run(
    argv: Sequence[str], cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv), cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False
    )


@pytest.fixture(scope="module")
def bare_venv(copy: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the copy's wheel installed and no extra. Offline when the package
    cache holds the pinned dependencies (as after .ci/setup), else from the index."""
    uv = Path(sys.executable).with_name("uv")
    assert uv.exists(), f"{uv} is missing: .ci/setup installs it"
    work = tmp_path_factory.mktemp("bare")
    # The wheel is built by this venv's setuptools (no build isolation): no index needed.
    built = _run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "--no-cache-dir", "-w", str(work / "wheels"), str(copy)]
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    (wheel,) = (work / "wheels").glob("shardq-*.whl")
    venv = work / "venv"
    made = _run([str(uv), "venv", "-q", "--python", sys.executable, str(venv)])
    assert made.returncode == 0, made.stderr
    install = [
        str(uv),
        "pip",
        "install",
        "-q",
        "--python",
        str(venv / "bin" / "python"),
        str(wheel),
    ]
    done = _run([*install, "--offline"])
    if done.returncode != 0:  # a cold cache: the index it is
        done = _run(install)
    assert done.returncode == 0, done.stderr
    return venv


def _bare_env(home: Path) -> dict[str, str]:
    """No SHARDQ_* variable and an empty HOME: no stray shardq.env is read."""
    return {"PATH": "/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8"}


_INSTALLED = """
import importlib.metadata, importlib.util, json, sys
dists = importlib.metadata.distributions()
names = sorted({d.metadata["Name"].lower().replace("_", "-") for d in dists})
found = [m for m in sys.argv[1:] if importlib.util.find_spec(m)]
print(json.dumps({"dists": names, "found": found}))
"""


def test_the_bare_install_is_the_client_and_nothing_of_the_servers(
    bare_venv: Path, tmp_path: Path
) -> None:
    run = _run(
        [str(bare_venv / "bin" / "python"), "-c", _INSTALLED, *SERVER_MODULES],
        cwd=tmp_path, env=_bare_env(tmp_path),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    installed = json.loads(run.stdout)
    assert installed["found"] == [], f"a bare install holds {installed['found']}"
    assert set(installed["dists"]) <= BARE_DISTRIBUTIONS | {"pip", "setuptools"}, installed


def test_a_bare_install_says_which_extra_an_ops_command_needs(
    bare_venv: Path, tmp_path: Path
) -> None:
    shardq = str(bare_venv / "bin" / "shardq")
    for argv, extra in (
        (["migrate"], "server"),
        (["shards", "sync", "127.0.0.1:1"], "server"),
        (["tokens", "list"], "server"),
        (["dev"], "dev"),
    ):
        run = _run([shardq, *argv], cwd=tmp_path, env=_bare_env(tmp_path))
        assert run.returncode == 1, (argv, run.stdout, run.stderr)
        (line,) = run.stderr.splitlines()  # one line, no traceback
        assert f"pip install 'shardq[{extra}]'" in line, (argv, line)
        assert line.startswith(f"shardq: error: `shardq {' '.join(argv[:2])}` needs"), line
    # The API commands' help still parses: their modules load without the extras.
    assert _run([shardq, "submit", "--help"], env=_bare_env(tmp_path)).returncode == 0
    assert _run([shardq, "shards", "map", "--help"], env=_bare_env(tmp_path)).returncode == 0


_SUBMIT = """
import sys
from shardq import Client, JobState
with Client(sys.argv[1], token=sys.argv[2]) as c:
    sub = c.submit("echo", {"hello": "world"})
    job = c.wait(sub.job_id, timeout=60)
    assert job.state is JobState.SUCCEEDED, job
    print(job.state.name, job.result)
"""


async def test_a_bare_install_submits_a_job_to_a_real_cluster(
    bare_venv: Path, database_url: str, tmp_path: Path
) -> None:
    env = _bare_env(tmp_path)
    async with running_cluster(database_url) as cluster, shard_loops(cluster):
        token = await cluster.token_for("bare")
        async with running_worker(cluster, ["echo"]):
            python = str(bare_venv / "bin" / "python")
            run = await asyncio.to_thread(
                _run, [python, "-c", _SUBMIT, cluster.target, token], cwd=tmp_path, env=env
            )
            assert run.returncode == 0, run.stderr
            assert run.stdout.strip() == "SUCCEEDED {'hello': 'world'}"
            # And the console script's API commands, in the same bare install.
            shardq = [str(bare_venv / "bin" / "shardq")]
            conn = ["--coordinator", cluster.target, "--token", token, "--json"]
            sub = await asyncio.to_thread(_run, [*shardq, "submit", "echo", "{}", *conn], env=env)
            assert sub.returncode == 0, sub.stderr
            job_id = json.loads(sub.stdout)["job"]["job_id"]
            got = await asyncio.to_thread(_run, [*shardq, "get", job_id, *conn], env=env)
            assert got.returncode == 0 and json.loads(got.stdout)["job_id"] == job_id, got.stderr
    assert not os.environ.get("PYTHONPATH")  # the venv's shardq was its own, not the checkout's
