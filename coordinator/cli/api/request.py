"""What an API command sends: the client its connection flags make (``--coordinator``,
``--token``, ``--tenant``, ``--tls``, ``--ca-file``, ``--cert-file``, ``--key-file``:
``shardq.common.config``), a page, a JSON payload."""

from __future__ import annotations

import argparse
import json

from shardq.client import Client, RetryPolicy
from shardq.common import tls
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
    return Client(
        args.coordinator,
        args.token,
        tenant_id=args.tenant,
        retry=RetryPolicy(attempts=3, cap_s=0.5),
        # An unreadable file or a certificate without its key: a usage error (exit 2).
        **tls.api_client_options(args),
    )


def payload_arg(text: str | None, what: str = "PAYLOAD_JSON") -> bytes:
    if text is None:
        return b""
    try:
        json.loads(text)
    except ValueError as exc:
        raise InvalidArgument(f"not JSON ({exc})", field=what) from exc
    return text.encode()
