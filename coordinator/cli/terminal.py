"""What the commands print (tables, JSON, times) and ask (the confirmation prompt)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime

from shardq.coordinator.cli.command import CommandError


def print_json(value: object) -> None:
    print(json.dumps(value, indent=2, default=str))


def print_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def plural(count: int, noun: str, many: str = "") -> str:
    """``1 shard``, ``2 shards``; ``many`` for the irregular (``plural(n, "entry", "entries")``)."""
    return f"{count} {noun if count == 1 else many or noun + 's'}"


def when(ms: int) -> str:
    """A unix time in ms as UTC to the second; ``-`` for 0 (never)."""
    return f"{datetime.fromtimestamp(ms / 1000, UTC):%Y-%m-%d %H:%M:%SZ}" if ms else "-"


def confirm(args: argparse.Namespace, question: str = "Go ahead?") -> bool:
    """Yes with ``--yes``; else ask on the terminal (none: refuse, and say to pass --yes)."""
    if args.yes:
        return True
    if not sys.stdin.isatty():
        raise CommandError("not a terminal: pass --yes to confirm")
    return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")
