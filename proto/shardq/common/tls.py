"""The PEM files a gRPC client of the coordinator reads: a CA to verify it, and a client
certificate for a coordinator that requires one (mTLS, ``--tls-client-ca-file``).

The worker (``--tls-ca-file``, ``--tls-cert-file``, ``--tls-key-file``) and the ``shardq``
API commands (``--ca-file``, ``--cert-file``, ``--key-file``) read them here, once, at start:
a file that cannot be read, a certificate without its key, or a key that is not the
certificate's is a usage error named by its flag, not a handshake that fails on every
reconnect. gRPC reports a refused client certificate only as a closed socket;
:func:`refusal_hint` says what that usually means.

No grpc import: the CLI loads this before it knows whether it calls the API.
"""

from __future__ import annotations

import argparse
from typing import Any

from shardq.common.config import env_name

#: How gRPC describes a connection the server closed during the TLS handshake, which is what
#: a client sees when the coordinator refuses its certificate (or the lack of one).
_CLOSED_IN_HANDSHAKE = ("socket closed", "handshake")


class TlsFileError(ValueError):
    """A TLS flag whose file cannot be used: a usage error (exit 2, as argparse's own)."""


def _flag(flag: str) -> str:
    return f"{flag} ({env_name(flag)})"


def read_pem(flag: str, path: str) -> bytes:
    """The bytes of ``path``, given as ``flag``; a file that cannot be read says so by name."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise TlsFileError(f"{flag}: cannot read {path}: {exc.strerror or exc}") from None


def client_certificate(
    cert_file: str, key_file: str, cert_flag: str, key_flag: str
) -> tuple[bytes, bytes] | None:
    """(key, chain) PEM from ``cert_file`` and ``key_file`` (both or neither), as gRPC's
    ``ssl_channel_credentials`` and the SDK's ``client_cert`` take them; None without them."""
    if not cert_file and not key_file:
        return None
    if not key_file:
        raise TlsFileError(f"{_flag(cert_flag)} is set without {_flag(key_flag)}: give both")
    if not cert_file:
        raise TlsFileError(f"{_flag(key_flag)} is set without {_flag(cert_flag)}: give both")
    chain, key = read_pem(cert_flag, cert_file), read_pem(key_flag, key_file)
    _check_pair(cert_file, key_file, cert_flag, key_flag)
    return key, chain


def _check_pair(cert_file: str, key_file: str, cert_flag: str, key_flag: str) -> None:
    """Refuse a key that is not the certificate's, or one gRPC cannot use (encrypted), now:
    gRPC would only fail each handshake with a message that names neither file."""
    import ssl  # noqa: PLC0415 - only a client certificate pays for it

    def no_password() -> bytes:
        # gRPC takes no key password; without this OpenSSL would prompt on the terminal.
        return b""

    try:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.load_cert_chain(cert_file, key_file, password=no_password)
    except ssl.SSLError as exc:
        raise TlsFileError(
            f"{cert_flag} {cert_file} and {key_flag} {key_file} are not a PEM certificate and "
            f"its unencrypted private key ({exc.reason or exc})"
        ) from None


def api_client_options(args: argparse.Namespace) -> dict[str, Any]:
    """``tls``, ``root_certificates`` and ``client_cert`` for ``shardq.client`` from the API
    connection flags (``config.add_api_connection``): a CA or a certificate implies TLS."""
    root = read_pem("--ca-file", args.ca_file) if args.ca_file else None
    cert = client_certificate(args.cert_file, args.key_file, "--cert-file", "--key-file")
    return {
        "tls": bool(args.tls or root or cert),
        "root_certificates": root,
        "client_cert": cert,
    }


def refusal_hint(details: str, *, client_cert: bool, cert_flags: str) -> str:
    """What to check when a TLS connection was closed in its handshake ("" for any other
    failure): the coordinator may require a client certificate (``cert_flags`` give one), or
    refuse this one. gRPC gives the client no reason; the coordinator's side knows it."""
    if not any(mark in details.lower() for mark in _CLOSED_IN_HANDSHAKE):
        return ""
    if client_cert:
        return (
            "the coordinator closed the TLS connection: it may refuse this client certificate; "
            "is it signed by the CA of the coordinator's --tls-client-ca-file, and still valid?"
        )
    return (
        "the coordinator closed the TLS connection: if it requires client certificates "
        f"(mTLS), give this client one with {cert_flags}"
    )
