"""The API user's commands: they call the coordinator over gRPC through ``shardq.client``, as
a tenant (its token) or for one (the admin token and ``--tenant``). One module per noun."""

from __future__ import annotations

import importlib
from typing import Any

#: The nouns' modules, in the order ``--help`` lists them. Imported on first use of
#: ``MODULES`` or ``COMMANDS`` only: ``shardq <command>`` loads just its own noun's module
#: (``shardq.coordinator.cli.WORDS``), so one command does not pay for every other's imports.
NAMES = ("jobs", "dead", "schedules", "stats", "tenants", "pause", "shards")


def __getattr__(name: str) -> Any:
    if name == "MODULES":
        return tuple(importlib.import_module(f"{__name__}.{n}") for n in NAMES)
    if name == "COMMANDS":
        return [c for m in __getattr__("MODULES") for c in m.commands.items]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
