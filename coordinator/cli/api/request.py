"""What an API command sends: the client its connection flags make (``--coordinator``,
``--token``, ``--tenant``, ``--tls``, ``--ca-file``: ``shardq.common.config``), a page, a JSON
payload."""

from __future__ import annotations

import argparse
import json

from shardq.client import Client, RetryPolicy
from shardq.common.errors import InvalidArgument, Unauthenticated
from shardq.coordinator.cli.command import arg

PAGE_ARGS = (
    arg("--page-size", type=int, default=0, help="most items (server default 100, max 1000)"),
    arg("--page-token", default="", help="next_page_token of the previous page"),
)


def api_client(args: argparse.Namespace) -> Client:
    """A blocking client from the connection options (close it after use)."""
    if not args.token:
        raise Unauthenticated("no token: pass --token or set SHARDQ_TOKEN")
    root = None
    if args.ca_file:
        try:
            with open(args.ca_file, "rb") as f:
                root = f.read()
        except OSError as exc:
            raise InvalidArgument(f"cannot read {args.ca_file}: {exc}", field="ca_file") from exc
    return Client(
        args.coordinator,
        args.token,
        tls=bool(args.tls or root),
        root_certificates=root,
        tenant_id=args.tenant,
        retry=RetryPolicy(attempts=3, cap_s=0.5),
    )


def payload_arg(text: str | None, what: str = "PAYLOAD_JSON") -> bytes:
    if text is None:
        return b""
    try:
        json.loads(text)
    except ValueError as exc:
        raise InvalidArgument(f"not JSON ({exc})", field=what) from exc
    return text.encode()
