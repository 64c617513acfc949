"""Real certificates made at test time with the openssl command: a CA, a server certificate
for 127.0.0.1 and a client certificate it signed, and a stranger (a client certificate signed
by another CA) for a coordinator that must refuse it.

Files in the directory: ``ca.pem``/``ca.key``, ``server.pem``/``server.key``,
``client.pem``/``client.key``, ``other-ca.pem``/``other-ca.key``, ``stranger.pem``/
``stranger.key``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_ca(d: Path, name: str) -> None:
    """``name``.pem and ``name``.key: a self-signed CA."""
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name}",
            "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.pem"))  # fmt: skip


def sign(d: Path, ca: str, name: str, extension: str) -> None:
    """``name``.pem and ``name``.key: a certificate signed by the CA ``ca`` of ``d``."""
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
            "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.csr"))  # fmt: skip
    ext = d / f"{name}.ext"
    ext.write_text(extension + "\n")
    openssl("x509", "-req", "-in", str(d / f"{name}.csr"), "-CA", str(d / f"{ca}.pem"),
            "-CAkey", str(d / f"{ca}.key"), "-CAcreateserial", "-days", "2",
            "-extfile", str(ext), "-out", str(d / f"{name}.pem"))  # fmt: skip


def make_pki(d: Path) -> Path:
    """Every file this module's docstring lists, in ``d``; ``d``."""
    make_ca(d, "ca")
    sign(d, "ca", "server", "subjectAltName=IP:127.0.0.1")
    sign(d, "ca", "client", "basicConstraints=CA:FALSE")
    make_ca(d, "other-ca")
    sign(d, "other-ca", "stranger", "basicConstraints=CA:FALSE")
    return d
