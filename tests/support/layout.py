"""Where shardq's source lies and where it installs, read from pyproject.toml's ``package-dir``.

The folders install under other names (``shard/`` as ``shardq/shard``, ``proto/shardq/`` as
``shardq``), so the tests that look at the source as installed map it with the same table
setuptools uses, never with a copy of it.
"""

from __future__ import annotations

import tomllib
from pathlib import Path, PurePosixPath
from typing import Any

#: The repository's root.
REPO = Path(__file__).resolve().parents[2]


def pyproject(root: Path) -> dict[str, Any]:
    with (root / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)


def setuptools_config(root: Path) -> dict[str, Any]:
    """pyproject.toml's ``[tool.setuptools]`` table."""
    config: dict[str, Any] = pyproject(root)["tool"]["setuptools"]
    return config


def package_dirs(root: Path) -> dict[str, Path]:
    """``package-dir``: package name -> its folder under ``root``."""
    mapping = setuptools_config(root)["package-dir"]
    return {package: root / folder for package, folder in mapping.items()}


def owning_package(root: Path, path: Path) -> str | None:
    """The mapped package whose folder holds ``path`` (the most specific), if any."""
    dirs = package_dirs(root)
    owners = [p for p, d in dirs.items() if path.is_relative_to(d)]
    return max(owners, key=lambda p: len(dirs[p].parts), default=None)


def installed_path(root: Path, path: Path) -> PurePosixPath:
    """Where the source file ``path`` lies once installed, relative to site-packages."""
    package = owning_package(root, path)
    if package is None:
        raise ValueError(f"{path} is in no folder that pyproject.toml's package-dir maps")
    relative = path.relative_to(package_dirs(root)[package])
    return PurePosixPath(*package.split("."), *relative.parts)


def module_files(root: Path, *, generated: bool = False) -> dict[str, Path]:
    """Installed module name -> source file, for every .py of the mapped folders (the
    generated ``*_pb2*.py`` only when ``generated``)."""
    out: dict[str, Path] = {}
    for folder in package_dirs(root).values():
        for path in sorted(folder.rglob("*.py")):
            if "__pycache__" in path.parts or (not generated and "_pb2" in path.name):
                continue
            parts = list(installed_path(root, path).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out
