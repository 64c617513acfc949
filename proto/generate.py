"""Generate the Python code of the shardq.v1 API from ``proto/shardq/v1/*.proto``.

Usage::

    python proto/generate.py          # regenerate the *_pb2* files in place
    python proto/generate.py --check  # exit 1, listing stale files, if they are out of date

The generated modules (``*_pb2.py``, ``*_pb2_grpc.py``) and their type stubs (``*.pyi``,
from mypy-protobuf) are committed next to the ``.proto`` files and import each other as
``shardq.v1.*``, the package that ``proto/shardq`` installs as.
"""

from __future__ import annotations

import argparse
import filecmp
import importlib.util
import os
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Sequence
from pathlib import Path

#: Include root passed to protoc (``-I``); proto import paths are relative to it.
PROTO_ROOT = Path(__file__).resolve().parent
#: Directory of the API's ``.proto`` files and of the code generated from them.
API_DIR = PROTO_ROOT / "shardq" / "v1"
#: Suffixes of the files this script writes, one set per ``.proto`` file.
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")


def proto_files() -> list[Path]:
    """The API's ``.proto`` files, sorted so the protoc command line is stable."""
    return sorted(API_DIR.glob("*.proto"))


def _plugin_path() -> str:
    """PATH for protoc with this interpreter's scripts dir first (the mypy-protobuf plugins)."""
    dirs = [sysconfig.get_path("scripts"), str(Path(sys.executable).parent)]
    return os.pathsep.join([*dict.fromkeys(dirs), os.environ.get("PATH", "")])


def _well_known_include() -> str:
    """Include dir of the google/protobuf well-known types bundled with grpcio-tools."""
    spec = importlib.util.find_spec("grpc_tools")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("grpcio-tools is not installed (pip install -e '.[dev]')")
    return str(Path(next(iter(spec.submodule_search_locations))) / "_proto")


def generate(out_dir: Path) -> None:
    """Run protoc on every API ``.proto``, writing the generated tree under ``out_dir``.

    ``out_dir`` plays the role of ``proto/``: files land in ``out_dir/shardq/v1/``.
    Raises ``RuntimeError`` with protoc's output when it fails.
    """
    sources = proto_files()
    if not sources:
        raise RuntimeError(f"no .proto files in {API_DIR}")
    out = str(out_dir)
    cmd = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{_well_known_include()}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        f"--mypy_out={out}",
        f"--mypy_grpc_out={out}",
        *(str(p.relative_to(PROTO_ROOT)) for p in sources),
    ]
    env = {**os.environ, "PATH": _plugin_path()}
    result = subprocess.run(
        cmd, cwd=PROTO_ROOT, env=env, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"protoc failed ({result.returncode}):\n{result.stderr}{result.stdout}")


def _display(path: Path) -> str:
    """``path`` relative to the repository root, as printed to the user."""
    return str(path.relative_to(PROTO_ROOT.parent))


def _generated_names(directory: Path) -> set[str]:
    return {p.name for p in directory.iterdir() if p.name.endswith(GENERATED_SUFFIXES)}


def check() -> list[str]:
    """Generate into a temporary dir and return the committed files that differ from it.

    Returns paths relative to the repository root: files that are missing, out of date, or
    left over from a ``.proto`` that no longer exists. An empty list means everything is up to date.
    """
    with tempfile.TemporaryDirectory(prefix="shardq-proto-") as tmp:
        generate(Path(tmp))
        fresh_dir = Path(tmp) / API_DIR.relative_to(PROTO_ROOT)
        fresh = _generated_names(fresh_dir)
        committed = _generated_names(API_DIR)
        stale = [
            name
            for name in sorted(fresh | committed)
            if name not in fresh
            or name not in committed
            or not filecmp.cmp(fresh_dir / name, API_DIR / name, shallow=False)
        ]
    return [_display(API_DIR / name) for name in stale]


def write() -> list[str]:
    """Regenerate in place, deleting generated files whose ``.proto`` is gone.

    Returns the written files, relative to the repository root.
    """
    stems = {p.stem for p in proto_files()}
    for path in API_DIR.iterdir():
        if path.name.endswith(GENERATED_SUFFIXES) and path.name.split("_pb2")[0] not in stems:
            path.unlink()
    generate(PROTO_ROOT)
    return [_display(API_DIR / name) for name in sorted(_generated_names(API_DIR))]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--check",
        action="store_true",
        help="do not write; exit 1 listing the generated files that are stale",
    )
    args = parser.parse_args(argv)
    try:
        if args.check:
            stale = check()
            if stale:
                print("stale generated files (run: python proto/generate.py):", file=sys.stderr)
                for name in stale:
                    print(f"  {name}", file=sys.stderr)
                return 1
            print("generated code is up to date")
            return 0
        for name in write():
            print(f"wrote {name}")
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
