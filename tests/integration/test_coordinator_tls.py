"""TLS is one setting: the coordinator serves only TLS, and with a client CA only to clients
that present a certificate it signed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from shardq.client import AsyncClient, RetryPolicy
from tests.support.cluster import running_cluster
from tests.support.pki import make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A CA, a server certificate for 127.0.0.1, a client certificate (tests.support.pki)."""
    yield make_pki(tmp_path_factory.mktemp("pki"))


async def test_with_tls_on_only_tls_clients_get_through(database_url: str, pki: Path) -> None:
    tls = {"tls_cert_file": str(pki / "server.pem"), "tls_key_file": str(pki / "server.key")}
    async with running_cluster(database_url, **tls) as cluster:
        token = await cluster.token_for("acme")
        ca = (pki / "ca.pem").read_bytes()
        async with AsyncClient(cluster.target, token, root_certificates=ca) as c:
            assert (await c.submit("h", {"x": 1})).job_id
        async with AsyncClient(cluster.target, token, retry=RetryPolicy(attempts=1)) as plain:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await plain.submit("h", {"x": 2})
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_with_a_client_ca_a_client_needs_a_certificate(database_url: str, pki: Path) -> None:
    tls = {
        "tls_cert_file": str(pki / "server.pem"),
        "tls_key_file": str(pki / "server.key"),
        "tls_client_ca_file": str(pki / "ca.pem"),
    }
    async with running_cluster(database_url, **tls) as cluster:
        token = await cluster.token_for("acme")
        ca = (pki / "ca.pem").read_bytes()
        cert = ((pki / "client.key").read_bytes(), (pki / "client.pem").read_bytes())
        async with AsyncClient(cluster.target, token, root_certificates=ca, client_cert=cert) as c:
            assert (await c.submit("h", {"x": 1})).job_id
        no_cert = AsyncClient(
            cluster.target, token, root_certificates=ca, retry=RetryPolicy(attempts=1)
        )
        async with no_cert:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await no_cert.submit("h", {"x": 2})
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
