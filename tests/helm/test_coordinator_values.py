"""The coordinator as the chart configures it: typed values become the variables the
coordinator reads (checked with the coordinator's own parser), and its probes ask what a real
coordinator process serves, where it serves it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from grpc_health.v1 import health_pb2

from shardq.coordinator import limits
from shardq.coordinator import server as coordinator_server
from shardq.coordinator.app import CoordinatorSettings
from shardq.coordinator.tools.redis_server import RedisProcess
from shardq.shard.models import TenantLimits
from tests.helm.conftest import Doc, Rendered
from tests.helm.test_chart import FULLNAME, container, env_of
from tests.support.coordinator_proc import coordinator_process, prepare_database

Render = Callable[[str], Rendered]


def coordinator_container(r: Rendered) -> Doc:
    dep = r.get("Deployment", f"{FULLNAME}-coordinator")
    return container(dep["spec"]["template"]["spec"], "coordinator")


def plain_env(c: Doc) -> dict[str, str]:
    """The container's variables that carry a value (not a Secret's)."""
    return {name: e["value"] for name, e in env_of(c).items() if "value" in e}


def settings_as_rendered(r: Rendered, monkeypatch: pytest.MonkeyPatch) -> CoordinatorSettings:
    """CoordinatorSettings as shardq-coordinator makes them from the rendered environment."""
    env = plain_env(coordinator_container(r))
    # Composed by Kubernetes from a Secret in the pod; any URL will do for parsing.
    env["SHARDQ_DATABASE_URL"] = "postgresql+psycopg://shardq@db.example.com/shardq"
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return coordinator_server.settings_from(coordinator_server.parse_args([]))


def test_tenant_defaults_reach_the_coordinator_as_the_json_it_parses(
    render: Render, monkeypatch: pytest.MonkeyPatch
) -> None:
    r = render("tenant-limits")
    raw = plain_env(coordinator_container(r))["SHARDQ_TENANT_LIMITS"]
    everyone, tenants = limits.parse_tenant_limits(raw, TenantLimits())
    assert everyone == TenantLimits(
        max_pending=100_000, max_pending_bytes=1_073_741_824, submit_rate_per_s=200.5
    )
    assert tenants == {
        "acme": TenantLimits(max_pending=1000, submit_rate_per_s=50.0, submit_burst=100),
        "big.tenant-01": TenantLimits(),
    }

    # The whole way through the coordinator's flags and variables, as the pod starts it.
    settings = settings_as_rendered(r, monkeypatch)
    assert settings.default_limits == everyone
    assert settings.tenant_limits == tenants
    acme = limits.overlay(settings.default_limits, settings.tenant_limits["acme"])
    assert (acme.max_pending, acme.max_pending_bytes, acme.submit_rate_per_s) == (
        1000,
        1_073_741_824,
        50.0,
    )
    assert settings.reject_unknown_handlers is True
    assert (settings.token_cache_ttl_s, settings.token_stale_max_s) == (2.5, 600.0)


def test_without_tenant_defaults_the_coordinator_keeps_its_own(
    render: Render, monkeypatch: pytest.MonkeyPatch
) -> None:
    r = render("default")
    assert "SHARDQ_TENANT_LIMITS" not in env_of(coordinator_container(r))
    settings = settings_as_rendered(r, monkeypatch)
    # The flags' defaults: 1,000,000 pending jobs of 256 MiB, nothing else; no tenant of its own.
    assert settings.default_limits == TenantLimits(
        max_pending=1_000_000, max_pending_bytes=256 << 20
    )
    assert settings.tenant_limits == {}
    assert settings.reject_unknown_handlers is False
    assert (settings.token_cache_ttl_s, settings.token_stale_max_s) == (5.0, 900.0)


# --------------------------------------------------------------------------- probes


def port_number(c: Doc, port: int | str) -> int:
    """A probe's port as the kubelet resolves it: a number, or the name of a container port."""
    if isinstance(port, int):
        return port
    (number,) = [p["containerPort"] for p in c["ports"] if p["name"] == port]
    assert isinstance(number, int)
    return number


def test_coordinator_probes_without_tls(render: Render) -> None:
    c = coordinator_container(render("default"))
    grpc_port = port_number(c, "grpc")
    ops_port = int(env_of(c)["SHARDQ_METRICS_PORT"]["value"])
    # Readiness: grpc.health.v1 for the whole server (""), on the gRPC port.
    assert c["readinessProbe"]["grpc"] == {"port": grpc_port, "service": ""}
    # Liveness and startup: the cheap /healthz, on the port the coordinator serves it on.
    for probe in ("livenessProbe", "startupProbe"):
        get = c[probe]["httpGet"]
        assert get["path"] == "/healthz", probe
        assert port_number(c, get["port"]) == ops_port, probe


@pytest.mark.parametrize("name", ["tls", "everything"])
def test_coordinator_readiness_behind_tls_is_readyz(render: Render, name: str) -> None:
    c = coordinator_container(render(name))
    ops_port = int(env_of(c)["SHARDQ_METRICS_PORT"]["value"])
    get = c["readinessProbe"]["httpGet"]
    assert get["path"] == "/readyz"
    assert port_number(c, get["port"]) == ops_port
    assert get.get("scheme", "HTTP") == "HTTP"  # the ops port is plain HTTP, TLS or not
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert not {"tcpSocket", "grpc"} & set(c[probe]), f"{probe}: {c[probe]}"


#: Variables the test's coordinator process sets itself (its ports, prefix and log level).
PROCESS_OWN = {"SHARDQ_LISTEN", "SHARDQ_METRICS_PORT", "SHARDQ_KEY_PREFIX", "SHARDQ_LOG_LEVEL"}


async def test_a_real_coordinator_answers_every_probe_the_chart_renders(
    render: Render, database_url: str
) -> None:
    """Start shardq-coordinator with the chart's settings and ask what each probe asks, as
    the kubelet would: a probe path the coordinator does not serve fails here, not in a
    cluster where the pods never become ready."""
    plain = coordinator_container(render("tenant-limits"))
    tls = coordinator_container(render("tls"))
    probes: list[Doc] = [
        plain["startupProbe"],
        plain["livenessProbe"],
        plain["readinessProbe"],
        tls["readinessProbe"],
    ]
    settings: dict[str, Any] = {
        name.removeprefix("SHARDQ_").lower(): value
        for name, value in plain_env(plain).items()
        if name.startswith("SHARDQ_") and name not in PROCESS_OWN and "$(" not in value
    }
    redis = RedisProcess().start()
    try:
        admin = await prepare_database(database_url, [redis])
        async with coordinator_process(database_url, admin, **settings) as coordinator:
            for probe in probes:
                await asyncio.wait_for(answers(coordinator, plain, probe), 60)
    finally:
        redis.cleanup()


async def answers(coordinator: Any, c: Doc, probe: Doc) -> None:
    """Wait until the probe passes against the running coordinator (it may still be starting
    its readiness checks); a 404 fails at once."""
    while True:
        if "grpc" in probe:
            assert probe["grpc"]["port"] == port_number(c, "grpc")
            status = await coordinator.health(probe["grpc"]["service"])
            if status == health_pb2.HealthCheckResponse.SERVING:
                return
        else:
            get = probe["httpGet"]
            assert port_number(c, get["port"]) == port_number(c, "metrics")
            code, _ = await asyncio.to_thread(coordinator.http, get["path"])
            assert code != 404, f"the coordinator does not serve {get['path']}"
            if 200 <= code < 400:
                return
        coordinator.check_alive()
        await asyncio.sleep(0.2)
