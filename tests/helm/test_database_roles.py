"""databaseRoles as the chart deploys it: the migration steps run ``shardq migrate --roles``
with every role's password (the variables proto/shardq/store/roles.py reads), and the
coordinator, the shard loops and the workers each connect as their own role, with a URL whose
password only their pods get; no worker container sees the migrator's login. With an external
database the URLs come from databaseRoles.host/database; without them the install is refused.
tests/integration/test_db_roles.py runs a cluster on such roles."""

from __future__ import annotations

import base64
from collections.abc import Callable

import sqlalchemy as sa

from shardq.store import roles
from tests.helm.conftest import Doc, Rendered
from tests.helm.test_chart import FULLNAME, container, env_of, worker_deployments
from tests.helm.test_invalid_values import template_error

Render = Callable[[str], Rendered]


def url_of(r: Rendered, c: Doc) -> sa.engine.URL:
    """The process's database URL with $(SHARDQ_DB_ROLE_PASSWORD) expanded as the kubelet
    does, from the rendered Secret (generated) or a stand-in (a Secret of your own)."""
    env = env_of(c)
    ref = env["SHARDQ_DB_ROLE_PASSWORD"]["valueFrom"]["secretKeyRef"]
    secrets = {s["metadata"]["name"]: s for s in r.kind("Secret")}
    if ref["name"] in secrets:
        password = base64.b64decode(secrets[ref["name"]]["data"][ref["key"]]).decode()
    else:
        password = f"pw-of-{ref['key']}"
    raw = env["SHARDQ_DATABASE_URL"]["value"].replace("$(SHARDQ_DB_ROLE_PASSWORD)", password)
    url = sa.engine.make_url(raw)
    assert url.password == password
    return url


def pods(r: Rendered) -> dict[str, Doc]:
    (worker,) = worker_deployments(r)
    return {
        "coordinator": r.get("Deployment", f"{FULLNAME}-coordinator")["spec"]["template"]["spec"],
        "shard": r.get("StatefulSet", f"{FULLNAME}-shard")["spec"]["template"]["spec"],
        "worker": worker["spec"]["template"]["spec"],
    }


def migrate_steps(r: Rendered) -> list[Doc]:
    hook = r.get("Job", f"{FULLNAME}-migrate")["spec"]["template"]["spec"]
    steps = [container(hook, "migrate")]
    init = pods(r)["coordinator"].get("initContainers", [])
    return steps + [c for c in init if c["name"] == "migrate"]


def test_each_process_connects_as_its_own_role(render: Render) -> None:
    r = render("database-roles")
    p = pods(r)
    for pod, name, role in (
        ("coordinator", "coordinator", "coordinator"),
        ("shard", "shard", "loop"),
        ("worker", "worker", "worker"),
    ):
        url = url_of(r, container(p[pod], name))
        assert (url.username, url.host, url.database) == (
            f"shardq_{role}",
            f"{FULLNAME}-postgresql",
            "shardq",
        )
    # A worker pod holds no migrator's login: no migrate step, no Postgres password Secret.
    assert "initContainers" not in p["worker"]
    for c in p["worker"]["containers"]:
        assert "SHARDQ_DB_PASSWORD" not in env_of(c)
    secret = r.get("Secret", f"{FULLNAME}-database-roles")
    assert sorted(secret["data"]) == ["coordinator", "loop", "worker"]


def test_the_migration_steps_make_the_roles_with_their_passwords(render: Render) -> None:
    r = render("database-roles")
    steps = migrate_steps(r)
    assert len(steps) == 2  # the hook, and the coordinator's step (bundled Postgres)
    for step in steps:
        assert step["command"] == ["shardq", "migrate", "--roles"]
        env = env_of(step)
        for role in roles.ROLES:
            ref = env[roles.password_variable(role)]["valueFrom"]["secretKeyRef"]
            assert (ref["name"], ref["key"]) == (f"{FULLNAME}-database-roles", role)


def test_an_external_database_composes_the_roles_urls(render: Render) -> None:
    r = render("database-roles-external")
    (hook,) = migrate_steps(r)
    assert hook["command"] == ["shardq", "migrate", "--roles", "--role-prefix", "jobs_"]
    url = url_of(r, container(pods(r)["worker"], "worker"))
    assert (url.username, url.host, url.port, url.database) == (
        "jobs_worker", "db.internal", 6432, "jobs",
    )  # fmt: skip
    assert dict(url.query) == {"sslmode": "require"}
    assert not any(s["metadata"]["name"].endswith("database-roles") for s in r.kind("Secret"))


def test_an_external_database_without_host_is_refused(helm: str) -> None:
    err = template_error(
        helm,
        "--skip-schema-validation",
        "--set", "postgresql.enabled=false",
        "--set", "externalDatabase.existingSecret=db",
        "--set", "databaseRoles.enabled=true",
    )  # fmt: skip
    assert "databaseRoles: with an external database, set databaseRoles.host" in err


def test_without_roles_every_process_keeps_the_one_url(render: Render) -> None:
    text = str(render("default").docs)
    assert "SHARDQ_DB_ROLE_PASSWORD" not in text and "--roles" not in text
