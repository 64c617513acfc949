"""``shardq-dashboard`` / ``shardq dashboard``: serve the dashboard (uvicorn) until stopped.

Binds 127.0.0.1 by default: the pages show every tenant's jobs to whoever holds a token, and
a token typed over plain HTTP from another machine would cross the network in clear. Give
``--dashboard-tls-cert``/``--dashboard-tls-key`` to serve HTTPS (the session cookie is then
Secure), or put it behind a TLS proxy and name the proxy in ``--forwarded-allow-ips``: the
connection the dashboard sees is then plain HTTP, and only a proxy it trusts may say, in
X-Forwarded-Proto, that the user's was HTTPS (which makes the cookie Secure).
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import uvicorn

from shardq.common import config
from shardq.coordinator.dashboard.app import DashboardSettings, create_app
from shardq.coordinator.dashboard.sessions import IDLE_S, MAX_AGE_S

log = logging.getLogger("shardq.dashboard")

#: The line printed (stdout) once the dashboard listens; tests and ``shardq dev`` read it.
READY = "shardq dashboard listening on"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    config.add(
        parser,
        "--dashboard-listen",
        "127.0.0.1:8080",
        "host:port the dashboard serves on (port 0: any free port)",
    )
    config.add(parser, "--coordinator", "127.0.0.1:50051", "the coordinator's host:port")
    parser.add_argument("--tls", action="store_true", help="reach the coordinator over TLS")
    config.add(parser, "--ca-file", "", "PEM CA to verify the coordinator (implies --tls)")
    config.add(
        parser,
        "--client-cert-file",
        "",
        "PEM certificate the dashboard presents to a coordinator that requires client "
        "certificates (mTLS; implies --tls; with --client-key-file)",
    )
    config.add(parser, "--client-key-file", "", "PEM key of --client-cert-file")
    config.add(parser, "--dashboard-tls-cert", "", "PEM certificate: serve HTTPS")
    config.add(parser, "--dashboard-tls-key", "", "PEM key of --dashboard-tls-cert")
    config.add(
        parser,
        "--forwarded-allow-ips",
        "",
        "comma-separated addresses or networks of the TLS-terminating proxies whose "
        "X-Forwarded-Proto/-For headers are believed ('*': any peer); none by default",
    )
    config.add(
        parser,
        "--dashboard-session-idle-s",
        IDLE_S,
        "seconds without a request after which a login ends",
        float,
    )
    config.add(
        parser,
        "--dashboard-session-max-age-s",
        MAX_AGE_S,
        "seconds after which a login ends however active (its live views close)",
        float,
    )
    config.add(
        parser,
        "--dashboard-sample-interval-s",
        5.0,
        "seconds between the samples of cluster totals behind the overview's charts",
        float,
    )
    config.add_log_level(parser)


def _listen(address: str) -> socket.socket:
    host, _, port = address.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, int(port)))
    sock.set_inheritable(True)
    return sock


def settings_from(args: argparse.Namespace) -> DashboardSettings:
    root = Path(args.ca_file).read_bytes() if args.ca_file else None
    if bool(args.client_cert_file) != bool(args.client_key_file):
        raise ValueError("--client-cert-file and --client-key-file go together")
    client_cert = (
        (Path(args.client_key_file).read_bytes(), Path(args.client_cert_file).read_bytes())
        if args.client_cert_file
        else None
    )
    for name in ("dashboard_session_idle_s", "dashboard_session_max_age_s"):
        if not 0 < getattr(args, name) < float("inf"):
            raise ValueError(f"--{name.replace('_', '-')} must be a positive number of seconds")
    return DashboardSettings(
        coordinator=args.coordinator,
        tls=bool(args.tls or root or client_cert),
        root_certificates=root,
        client_cert=client_cert,
        sample_interval_s=args.dashboard_sample_interval_s,
        session_idle_s=args.dashboard_session_idle_s,
        session_max_age_s=args.dashboard_session_max_age_s,
    )


def proxy_settings(forwarded_allow_ips: str) -> dict[str, Any]:
    """uvicorn's proxy-header settings: off unless proxies are named. uvicorn's own default
    believes 127.0.0.1 (or $FORWARDED_ALLOW_IPS), which would let any local process, or a
    proxy in front that passes a client's own X-Forwarded-Proto through, decide the scheme."""
    ips = [part.strip() for part in forwarded_allow_ips.split(",") if part.strip()]
    if not ips:
        return {"proxy_headers": False, "forwarded_allow_ips": []}
    for ip in ips:
        # uvicorn keeps a malformed entry as a literal that never matches: refused here, so
        # a typo does not leave the cookie silently without Secure.
        if ip != "*":
            try:
                ipaddress.ip_network(ip, strict=False)
            except ValueError:
                raise ValueError(
                    f"--forwarded-allow-ips: {ip!r} is not an address, a network or '*'"
                ) from None
    return {"proxy_headers": True, "forwarded_allow_ips": ["*"] if "*" in ips else ips}


async def serve(args: argparse.Namespace) -> None:
    settings = settings_from(args)
    sock = _listen(args.dashboard_listen)
    host, port = sock.getsockname()[:2]
    tls = bool(args.dashboard_tls_cert)
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(settings),
            log_config=None,  # our JSON logging (config.setup_logging), not uvicorn's
            access_log=True,
            ssl_certfile=args.dashboard_tls_cert or None,
            ssl_keyfile=args.dashboard_tls_key or None,
            server_header=False,
            **proxy_settings(args.forwarded_allow_ips),
            # Server-sent events of a job page end when the job does or the tab closes; a
            # stop waits this long for them, then closes them.
            timeout_graceful_shutdown=3,
        )
    )
    scheme = "https" if tls else "http"
    shown = f"[{host}]" if ":" in host else host

    async def announce() -> None:
        # uvicorn has no "started" callback: its flag is polled until it turns.
        while not server.started:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        print(f"{READY} {scheme}://{shown}:{port}/", flush=True)

    announcer = asyncio.create_task(announce())
    try:
        await server.serve(sockets=[sock])
    finally:
        announcer.cancel()
        sock.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="shardq-dashboard",
        description="the shardq web dashboard, a client of the coordinator's API",
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM (``shardq dashboard`` and ``shardq-dashboard``)."""
    config.setup_logging(args.log_level)
    try:
        asyncio.run(serve(args))
    except KeyboardInterrupt:
        pass
    except (OSError, ValueError) as exc:  # a port taken, a setting out of range
        print(f"shardq-dashboard: {exc}", file=sys.stderr)
        return 1
    return 0
