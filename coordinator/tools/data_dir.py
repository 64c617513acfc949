"""The working folder of ``shardq dev``, which ``shardq demo`` reads too: where it is by
default, and its tokens file (``tokens.json``: the admin, worker and tenant tokens, mode 0600).

``shardq dev`` writes the file and ``shardq demo`` reads its admin token; both go through
:func:`read_tokens` and :func:`write_tokens`, so neither tool imports the other.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

TOKENS_FILE = "tokens.json"
#: ``shardq dev``'s connection settings (SHARDQ_DATABASE_URL, SHARDQ_COORDINATOR, tokens) as
#: ``KEY=value`` lines: the ``shardq`` command's last fallback, and ``set -a; . FILE`` for a shell.
ENV_FILE = "shardq.env"
#: The variable that moves the data dir (``shardq dev --data-dir``'s own).
DATA_DIR_VAR = "SHARDQ_DEV_DATA_DIR"


def default_data_dir() -> Path:
    """``$XDG_CACHE_HOME/shardq/dev``, else ``~/.cache/shardq/dev``."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "shardq" / "dev"


def dev_env_file() -> Path:
    """The env file of the local cluster: in ``$SHARDQ_DEV_DATA_DIR``, else the default dir."""
    return Path(os.environ.get(DATA_DIR_VAR) or default_data_dir()).expanduser() / ENV_FILE


def tokens_path(data_dir: str | Path) -> Path:
    return Path(data_dir).expanduser() / TOKENS_FILE


@dataclass
class Tokens:
    """The tokens of a local cluster; an empty string is a token not made yet."""

    admin: str = ""
    worker: str = ""
    #: tenant ID -> that tenant's token
    tenants: dict[str, str] = field(default_factory=dict)


def read_tokens(path: Path) -> Tokens:
    """The tokens stored at ``path``; none when it is missing or unreadable."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return Tokens()
    if not isinstance(doc, dict):
        return Tokens()
    return Tokens(
        admin=str(doc.get("admin") or ""),
        worker=str(doc.get("worker") or ""),
        tenants=dict(doc.get("tenants") or {}),
    )


def write_tokens(path: Path, tokens: Tokens) -> None:
    """Store ``tokens`` at ``path``, readable by this user only."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"admin": tokens.admin, "worker": tokens.worker, "tenants": tokens.tenants}, f)
