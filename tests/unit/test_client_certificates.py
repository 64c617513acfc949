"""The client certificate flags of the worker (``--tls-cert-file``/``--tls-key-file``) and of
the ``shardq`` API commands (``--cert-file``/``--key-file``), on real PEM files made with
openssl: both or neither, read once at start, a key that is not the certificate's refused
there, and a certificate alone means TLS."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardq.common import config, tls
from shardq.worker import __main__ as worker_main
from tests.support.pki import make_pki, openssl


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield make_pki(tmp_path_factory.mktemp("pki"))


def worker_args(monkeypatch: pytest.MonkeyPatch, **variables: Path) -> argparse.Namespace:
    """The worker's flags as its parser reads them from SHARDQ_<NAME> variables."""
    for name, value in variables.items():
        monkeypatch.setenv(f"SHARDQ_{name.upper()}", str(value))
    return worker_main.parse_args(["--database-url", "postgresql://x/y"])


def test_the_worker_reads_its_certificate_and_key_from_its_variables(
    pki: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = worker_args(
        monkeypatch,
        tls_ca_file=pki / "ca.pem",
        tls_cert_file=pki / "client.pem",
        tls_key_file=pki / "client.key",
    )
    reach = worker_main.coordinator_tls(args)
    assert reach is not None
    assert reach.root_certificates == (pki / "ca.pem").read_bytes()
    # (key, chain): the order grpc.ssl_channel_credentials takes them in.
    assert reach.client_cert == (
        (pki / "client.key").read_bytes(),
        (pki / "client.pem").read_bytes(),
    )


def test_a_worker_certificate_alone_means_tls_and_nothing_means_plaintext(
    pki: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert worker_main.coordinator_tls(worker_args(monkeypatch)) is None
    args = worker_args(
        monkeypatch, tls_cert_file=pki / "client.pem", tls_key_file=pki / "client.key"
    )
    reach = worker_main.coordinator_tls(args)
    assert reach is not None and reach.root_certificates is None  # the system's CAs
    assert reach.client_cert is not None


@pytest.mark.parametrize(
    ("given", "missing"),
    [
        ("tls_cert_file", "--tls-key-file (SHARDQ_TLS_KEY_FILE)"),
        ("tls_key_file", "--tls-cert-file (SHARDQ_TLS_CERT_FILE)"),
    ],
)
def test_a_worker_given_half_a_pair_stops_naming_the_other_half(
    pki: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    given: str,
    missing: str,
) -> None:
    path = pki / ("client.pem" if given == "tls_cert_file" else "client.key")
    args = worker_args(monkeypatch, **{given: path})
    with pytest.raises(SystemExit) as info:
        worker_main.coordinator_tls(args)
    assert info.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("shardq-worker: error: ") and f"without {missing}" in line, line


def test_a_worker_certificate_that_cannot_be_read_stops_it_in_one_line(
    pki: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    args = worker_args(
        monkeypatch, tls_cert_file=tmp_path / "gone.pem", tls_key_file=pki / "client.key"
    )
    with pytest.raises(SystemExit) as info:
        worker_main.coordinator_tls(args)
    assert info.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (
        f"shardq-worker: error: --tls-cert-file: cannot read {tmp_path / 'gone.pem'}: "
        "No such file or directory"
    )


def test_a_key_that_is_not_the_certificates_is_refused_at_start(pki: Path) -> None:
    with pytest.raises(tls.TlsFileError) as info:
        tls.client_certificate(
            str(pki / "client.pem"), str(pki / "stranger.key"), "--cert-file", "--key-file"
        )
    message = str(info.value)
    assert "--cert-file" in message and "--key-file" in message
    assert "KEY_VALUES_MISMATCH" in message, message


def test_an_encrypted_key_is_refused_without_asking_for_its_password(
    pki: Path, tmp_path: Path
) -> None:
    # gRPC takes no key password: such a key could never be used.
    locked = tmp_path / "locked.key"
    openssl("pkey", "-in", str(pki / "client.key"), "-aes256", "-passout", "pass:secret",
            "-out", str(locked))  # fmt: skip
    with pytest.raises(tls.TlsFileError, match="unencrypted private key"):
        tls.client_certificate(str(pki / "client.pem"), str(locked), "--cert-file", "--key-file")


def api_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    config.add_api_connection(parser)
    return parser.parse_args(argv)


def test_the_cli_certificate_means_tls_and_reaches_the_client_options(pki: Path) -> None:
    args = api_args(["--cert-file", str(pki / "client.pem"), "--key-file", str(pki / "client.key")])
    options = tls.api_client_options(args)
    assert options == {
        "tls": True,
        "root_certificates": None,
        "client_cert": ((pki / "client.key").read_bytes(), (pki / "client.pem").read_bytes()),
    }
    assert tls.api_client_options(api_args([])) == {
        "tls": False,
        "root_certificates": None,
        "client_cert": None,
    }


@pytest.mark.parametrize(
    ("details", "client_cert", "says"),
    [
        ("failed to connect to all addresses; last error: UNAVAILABLE: ipv4:10.0.0.1:50051: "
         "Socket closed", False, "give this client one with --x"),
        ("Socket closed", True, "it may refuse this client certificate"),
        ("Ssl handshake failed: SSL_ERROR_SSL", True, "it may refuse this client certificate"),
        ("failed to connect to all addresses; last error: UNKNOWN: ipv4:10.0.0.1:50051: "
         "Failed to connect to remote host: Connection refused", False, ""),
    ],
)  # fmt: skip
def test_a_connection_closed_in_the_handshake_is_explained(
    details: str, client_cert: bool, says: str
) -> None:
    hint = tls.refusal_hint(details, client_cert=client_cert, cert_flags="--x")
    assert (says in hint) if says else hint == ""
