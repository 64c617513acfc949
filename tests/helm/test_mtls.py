"""mTLS on every gRPC hop as the chart deploys it: with tls.clientAuth the coordinator requires
client certificates, and each worker group mounts a client certificate Secret (its own, or the
workers') where the variables the worker's own parser reads point to. Without clientAuth no
client certificate is mounted; clientAuth with a worker group that has none is refused."""

from __future__ import annotations

import argparse
import posixpath
from collections.abc import Callable
from types import ModuleType

import pytest

from shardq.worker import __main__ as worker_main
from tests.helm.conftest import VALUES_DIR, Doc, Rendered, run_helm, template_args
from tests.helm.test_chart import FULLNAME, container, env_of, worker_deployments

Render = Callable[[str], Rendered]
TLS = ["--set", "tls.enabled=true", "--set", "tls.existingSecret=s", "--set", "tls.clientAuth=true"]
GROUP = [
    "--set",
    "workers.groups[0].name=default",
    "--set",
    "workers.groups[0].handlers=myapp.jobs",
]


def worker_args(c: Doc, monkeypatch: pytest.MonkeyPatch) -> argparse.Namespace:
    """What shardq-worker's parser reads from the container's variables."""
    for name, e in env_of(c).items():
        if "value" in e:
            monkeypatch.setenv(name, e["value"])
    return worker_main.parse_args([])


def mounted_file(pod: Doc, c: Doc, path: str) -> tuple[str, str]:
    """(Secret name, key) behind ``path`` in container ``c``: the volume mounted at its folder
    and the Secret item projected to its file name."""
    folder, name = posixpath.split(path)
    (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == folder]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    (key,) = [i["key"] for i in volume["secret"]["items"] if i["path"] == name]
    secret: str = volume["secret"]["secretName"]
    return secret, key


def test_with_client_auth_each_worker_presents_its_groups_certificate(
    render: Render, monkeypatch: pytest.MonkeyPatch
) -> None:
    r = render("mtls")
    coordinator = container(
        r.get("Deployment", f"{FULLNAME}-coordinator")["spec"]["template"]["spec"], "coordinator"
    )
    assert env_of(coordinator)["SHARDQ_TLS_CLIENT_CA_FILE"]["value"] == "/etc/shardq/tls/ca.crt"
    expected = {
        f"{FULLNAME}-worker-default": "shardq-worker-client",  # workers.clientCertSecret
        f"{FULLNAME}-worker-reports": "shardq-reports-client",  # the group's own
    }
    seen = {}
    for d in worker_deployments(r):
        pod = d["spec"]["template"]["spec"]
        c = container(pod, "worker")
        with monkeypatch.context() as env:
            args = worker_args(c, env)
        cert_secret, cert_key = mounted_file(pod, c, args.tls_cert_file)
        key_secret, key_key = mounted_file(pod, c, args.tls_key_file)
        assert cert_secret == key_secret
        assert (cert_key, key_key) == ("tls.crt", "tls.key")
        # The CA that verifies the coordinator, from the coordinator's Secret (its CA only).
        assert mounted_file(pod, c, args.tls_ca_file) == ("shardq-coordinator-tls", "ca.crt")
        seen[d["metadata"]["name"]] = cert_secret
    assert seen == expected


def test_without_client_auth_no_client_certificate_is_mounted(
    helm: str, yaml_mod: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    # TLS without clientAuth: a workers.clientCertSecret left in the values is not used.
    extra = ["--set", "workers.clientCertSecret=unused"]
    proc = run_helm(helm, *template_args([VALUES_DIR / "tls.yaml"], extra))
    assert proc.returncode == 0, proc.stderr
    r = Rendered("tls", [d for d in yaml_mod.safe_load_all(proc.stdout) if d])
    (d,) = worker_deployments(r)
    pod = d["spec"]["template"]["spec"]
    c = container(pod, "worker")
    args = worker_args(c, monkeypatch)
    assert (args.tls_cert_file, args.tls_key_file) == ("", "")
    assert args.tls_ca_file == "/etc/shardq/tls/ca.crt"
    assert "client-cert" not in {v["name"] for v in pod["volumes"]}


def test_client_auth_with_a_group_without_a_certificate_is_refused(helm: str) -> None:
    proc = run_helm(helm, *template_args([], [*TLS, *GROUP]))
    assert proc.returncode != 0
    assert "workers.clientCertSecret: required with tls.clientAuth" in proc.stderr, proc.stderr
    assert "groups without one: default" in proc.stderr, proc.stderr
    # A group's own certificate is enough.
    own = [*TLS, *GROUP, "--set", "workers.groups[0].clientCertSecret=mine"]
    proc = run_helm(helm, *template_args([], own))
    assert proc.returncode == 0, proc.stderr
