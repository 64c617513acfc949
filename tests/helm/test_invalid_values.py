"""Invalid values fail `helm template` once, with a message that names every problem."""

from __future__ import annotations

from types import ModuleType

import pytest

from tests.helm.conftest import run_helm, template_args

WORKER = [
    "--set",
    "workers.groups[0].name=default",
    "--set",
    "workers.groups[0].handlers=myapp.jobs",
]


def template_error(helm: str, *sets: str) -> str:
    proc = run_helm(helm, *template_args([], list(sets)))
    assert proc.returncode != 0, f"helm template accepted {sets}"
    return proc.stderr


def test_zero_shards(helm: str) -> None:
    err = template_error(helm, "--set", "shards.count=0")
    assert "shards.count: Must be greater than or equal to 1" in err


def test_unknown_enum(helm: str) -> None:
    err = template_error(helm, "--set", "shards.redis.appendfsync=sometimes")
    assert "shards.redis.appendfsync" in err
    assert '"always", "everysec", "no"' in err


def test_missing_database_secret(helm: str) -> None:
    err = template_error(helm, "--set", "postgresql.enabled=false")
    assert "externalDatabase.existingSecret" in err


def test_every_problem_is_listed_at_once(helm: str) -> None:
    err = template_error(
        helm,
        "--set", "shards.count=0",
        "--set", "logLevel=LOUD",
        "--set", "postgresql.enabled=false",
        "--set", "workers.groups[0].name=Not_A_Label",
    )  # fmt: skip
    for expected in (
        "shards.count: Must be greater than or equal to 1",
        'logLevel: logLevel must be one of the following: "DEBUG", "INFO"',
        "externalDatabase.existingSecret",
        "workers.groups.0: handlers is required",
        "workers.groups.0.name: Does not match pattern",
    ):
        assert expected in err, f"{expected!r} missing from:\n{err}"


def test_validate_values_lists_every_relation_problem(helm: str) -> None:
    err = template_error(
        helm,
        *WORKER,
        "--set", "workers.groups[1].name=default",
        "--set", "workers.groups[1].handlers=myapp.other",
        "--set", "workers.groups[1].queues={other}",
        "--set", "tls.enabled=true",
        "--set", "tls.clientAuth=true",
        "--set", "coordinator.pdb.minAvailable=5",
        "--set", "coordinator.autoscaling.enabled=true",
        "--set", "coordinator.autoscaling.minReplicas=5",
        "--set", "coordinator.autoscaling.maxReplicas=3",
    )  # fmt: skip
    assert "VALUES VALIDATION (5 problem(s))" in err, err
    for expected in (
        "tls.existingSecret: required when tls.enabled",
        "workers.clientCertSecret: required with tls.clientAuth",
        "coordinator.autoscaling: minReplicas (5) is above maxReplicas (3)",
        "coordinator.pdb.minAvailable (5) must be below the coordinator's replicas (5)",
        "workers.groups[1] (default).name: duplicate worker group name",
    ):
        assert expected in err, f"{expected!r} missing from:\n{err}"


@pytest.mark.parametrize(
    ("sets", "expected"),
    [
        # Without the schema (helm --skip-schema-validation), validateValues still catches them.
        (["--set", "postgresql.enabled=false"], "externalDatabase: no database secret"),
        (["--set", "shards.count=0"], "shards.count: must be at least 1 (got 0)"),
        (
            ["--set", "externalDatabase.url=postgresql+psycopg://u:p@db/x"],
            "set either postgresql.enabled or externalDatabase, not both",
        ),
    ],
)
def test_validate_values_without_the_schema(helm: str, sets: list[str], expected: str) -> None:
    err = template_error(helm, "--skip-schema-validation", *sets)
    assert "VALUES VALIDATION" in err
    assert expected in err


def test_two_groups_with_different_handlers_cannot_share_a_queue(helm: str) -> None:
    err = template_error(
        helm,
        *WORKER,
        "--set", "workers.groups[1].name=reports",
        "--set", "workers.groups[1].handlers=myapp.reports",
        "--set", "workers.groups[1].queues={reports,default}",
        "--set", "workers.groups[2].name=email",
        "--set", "workers.groups[2].handlers=myapp.email",
        "--set", "workers.groups[2].queues={reports}",
    )  # fmt: skip
    assert "VALUES VALIDATION (2 problem(s))" in err, err
    for expected in (
        'workers.groups[1] (reports).queues: queue "default" is also served by '
        "workers.groups[0] (default) with other handlers (myapp.jobs vs myapp.reports)",
        'workers.groups[2] (email).queues: queue "reports" is also served by '
        "workers.groups[1] (reports) with other handlers (myapp.reports vs myapp.email)",
        "Give each group its own queues, or set workers.allowSharedQueues=true",
    ):
        assert expected in err, f"{expected!r} missing from:\n{err}"


def test_groups_may_share_a_queue_when_allowed_or_when_their_handlers_agree(helm: str) -> None:
    shared = [
        *WORKER,
        "--set", "workers.groups[1].name=big",
        "--set", "workers.groups[1].handlers=myapp.other",
    ]  # fmt: skip
    assert run_helm(helm, *template_args([], shared)).returncode != 0
    allowed = run_helm(
        helm, *template_args([], [*shared, "--set", "workers.allowSharedQueues=true"])
    )
    assert allowed.returncode == 0, allowed.stderr
    same_handlers = [
        *WORKER,
        "--set", "workers.groups[1].name=big",
        "--set", "workers.groups[1].handlers=myapp.jobs",
        "--set", "workers.groups[1].concurrency=256",
    ]  # fmt: skip
    proc = run_helm(helm, *template_args([], same_handlers))
    assert proc.returncode == 0, proc.stderr


def test_queue_names_are_checked_with_and_without_the_schema(helm: str) -> None:
    bad = [*WORKER, "--set", "workers.groups[0].queues={ok,not a queue}"]
    err = template_error(helm, *bad)
    assert "workers.groups.0.queues.1: Does not match pattern" in err, err
    err = template_error(helm, "--skip-schema-validation", *bad)
    assert 'workers.groups[0] (default).queues: "not a queue" is not a queue name' in err, err
    empty = template_error(helm, *WORKER, "--set-json", "workers.groups[0].queues=[]")
    assert "workers.groups.0.queues: Array must have at least 1 items" in empty, empty


def test_a_worker_group_needs_handlers(helm: str) -> None:
    err = template_error(helm, "--set", "workers.groups[0].name=default")
    assert "workers.groups.0: handlers is required" in err


def test_moves_wait_must_fit_in_the_moves_job(helm: str) -> None:
    err = template_error(
        helm,
        "--set", "hooks.moves.activeWaitSeconds=900",
        "--set", "hooks.moves.activeDeadlineSeconds=600",
    )  # fmt: skip
    assert (
        "hooks.moves.activeWaitSeconds (900) must be below hooks.moves.activeDeadlineSeconds (600)"
    ) in err, err


def test_moves_settings_are_typed(helm: str) -> None:
    err = template_error(
        helm,
        "--set", "hooks.moves.activeWaitSeconds=0",
        "--set-string", "hooks.moves.activeDeadlineSeconds=forever",
        "--set", "hooks.moves.retries=3",
    )  # fmt: skip
    for expected in (
        "hooks.moves.activeWaitSeconds: Must be greater than or equal to 1",
        "hooks.moves.activeDeadlineSeconds: Invalid type. Expected: integer",
        "Additional property retries is not allowed",
    ):
        assert expected in err, f"{expected!r} missing from:\n{err}"


QUANTITY = "Does not match pattern '^([0-9]+(\\.[0-9]*)?|\\.[0-9]+)([KMGTPE]i|[numkMGTPE]|"


def test_resource_quantities_are_checked(helm: str) -> None:
    err = template_error(
        helm,
        "--set", "coordinator.resources.requests.cpu=lots",
        "--set", "shards.redis.resources.limits.memory=4GB",
        "--set-string", "hooks.resources.requests.ephemeral-storage=big",
        "--set", "coordinator.resources.request.cpu=1",
        "--set", "workers.resources.limits.gpu=1",
    )  # fmt: skip
    for expected in (
        f"coordinator.resources.requests.cpu: {QUANTITY}",
        f"shards.redis.resources.limits.memory: {QUANTITY}",
        f"hooks.resources.requests.ephemeral-storage: {QUANTITY}",
        "coordinator.resources: Additional property request is not allowed",
        # An extended resource needs its domain (nvidia.com/gpu), as Kubernetes says.
        'workers.resources.limits: Property name of "gpu" does not match',
    ):
        assert expected in err, f"{expected!r} missing from:\n{err}"


def test_good_quantities_pass(helm: str) -> None:
    proc = run_helm(
        helm,
        *template_args(
            [],
            [
                "--set", "coordinator.resources.requests.cpu=250m",
                "--set", "coordinator.resources.limits.cpu=2",
                "--set-json", "coordinator.resources.requests.memory=1.5e9",
                "--set", "shards.resources.limits.ephemeral-storage=1Gi",
                "--set", "workers.resources.limits.nvidia\\.com/gpu=1",
            ],
        ),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr


def test_placement_and_security_contexts_are_typed(helm: str) -> None:
    err = template_error(
        helm,
        "--set", "coordinator.podAntiAffinityPreset=sometimes",
        "--set", "shards.zoneSpreadPreset=maybe",
        "--set", "coordinator.affinity.podAntiAfinity.x=1",
        "--set", "shards.tolerations[0].operator=Maybe",
        "--set", "shards.topologySpreadConstraints[0].maxSkew=1",
        "--set", "podSecurityContext.runAsUser=-1",
        "--set", "containerSecurityContext.privileged=yes",
        "--set", "containerSecurityContext.runAsRoot=true",
    )  # fmt: skip
    for expected in (
        'coordinator.podAntiAffinityPreset must be one of the following: "soft", "hard", "none"',
        'shards.zoneSpreadPreset must be one of the following: "soft", "hard", "none"',
        "coordinator.affinity: Additional property podAntiAfinity is not allowed",
        'shards.tolerations.0.operator must be one of the following: "Exists", "Equal"',
        "shards.topologySpreadConstraints.0: topologyKey is required",
        "shards.topologySpreadConstraints.0: whenUnsatisfiable is required",
        "podSecurityContext.runAsUser: Must be greater than or equal to 0",
        "containerSecurityContext.privileged: Invalid type. Expected: boolean, given: string",
        "containerSecurityContext: Additional property runAsRoot is not allowed",
    ):
        assert expected in err, f"{expected!r} missing from:\n{err}"


def test_tenant_defaults_are_typed(helm: str) -> None:
    bad = [
        "--set", "coordinator.tenantDefaults.everyone.maxActive=5",
        "--set-json", 'coordinator.tenantDefaults.tenants={"no/slash": {"maxPending": 1}}',
        "--set", "coordinator.tenantDefaults.tenants.acme.maxPending=-1",
        "--set-string", "coordinator.tokenCache.ttlSeconds=soon",
    ]  # fmt: skip
    err = template_error(helm, *bad)
    for expected in (
        "coordinator.tenantDefaults.everyone: Additional property maxActive is not allowed",
        'coordinator.tenantDefaults.tenants: Property name of "no/slash" does not match',
        "coordinator.tenantDefaults.tenants.acme.maxPending: Must be greater than or equal to 0",
        "coordinator.tokenCache.ttlSeconds: Invalid type. Expected: number, given: string",
    ):
        assert expected in err, f"{expected!r} missing from:\n{err}"
    # Without the schema, validateValues still refuses what the coordinator would refuse at
    # start (a crash-looping pod), naming the value.
    err = template_error(helm, "--skip-schema-validation", *bad[:4])
    for expected in (
        "coordinator.tenantDefaults.everyone.maxActive: not a default limit",
        'coordinator.tenantDefaults.tenants: "no/slash" is not a tenant ID',
    ):
        assert expected in err, f"{expected!r} missing from:\n{err}"


def test_extra_env_cannot_shadow_a_typed_value(helm: str) -> None:
    err = template_error(
        helm,
        "--set", "coordinator.extraEnv[0].name=SHARDQ_TENANT_LIMITS",
        "--set", "coordinator.extraEnv[0].value={}",
        "--set", "coordinator.extraEnv[1].name=SHARDQ_TOKEN_STALE_MAX_S",
        "--set", "coordinator.extraEnv[1].value=60",
    )  # fmt: skip
    assert "VALUES VALIDATION (2 problem(s))" in err, err
    for expected in (
        "coordinator.extraEnv[0]: SHARDQ_TENANT_LIMITS is set from coordinator.tenantDefaults",
        "coordinator.extraEnv[1]: SHARDQ_TOKEN_STALE_MAX_S is set from "
        "coordinator.tokenCache.staleMaxSeconds",
    ):
        assert expected in err, f"{expected!r} missing from:\n{err}"


def test_worker_budgets_that_would_block_drains_are_refused(helm: str) -> None:
    err = template_error(
        helm,
        *WORKER,
        "--set", "workers.groups[0].pdb.minAvailable=2",
        "--set", "workers.groups[1].name=reports",
        "--set", "workers.groups[1].handlers=myapp.reports",
        "--set", "workers.groups[1].queues={reports}",
        "--set", "workers.groups[1].pdb.maxUnavailable=0",
        "--set", "workers.groups[2].name=batch",
        "--set", "workers.groups[2].handlers=myapp.batch",
        "--set", "workers.groups[2].queues={batch}",
        "--set", "workers.groups[2].pdb.minAvailable=1",
        "--set", "workers.groups[2].pdb.maxUnavailable=1",
    )  # fmt: skip
    assert "VALUES VALIDATION (3 problem(s))" in err, err
    for expected in (
        "workers.groups[0] (default).pdb.minAvailable (2) must be below the replicas of "
        "workers.groups[0] (default) (2)",
        "workers.groups[1] (reports).pdb.maxUnavailable: 0 would block every node drain",
        "workers.groups[2] (batch).pdb: set minAvailable or maxUnavailable, not both",
    ):
        assert expected in err, f"{expected!r} missing from:\n{err}"
    # An autoscaled group may shrink to its minReplicas: the budget must stay below that.
    autoscaled = template_error(
        helm,
        *WORKER,
        "--set", "workers.groups[0].autoscaling.enabled=true",
        "--set", "workers.groups[0].autoscaling.minReplicas=1",
        "--set", "workers.groups[0].pdb.minAvailable=1",
    )  # fmt: skip
    assert "must be below the replicas of workers.groups[0] (default) (1)" in autoscaled
    percent = template_error(helm, *WORKER, "--set", "workers.pdb.maxUnavailable=every")
    assert "workers.pdb.maxUnavailable: Does not match pattern" in percent, percent


def test_without_generated_secrets_every_credential_must_be_named(helm: str) -> None:
    """generateSecrets=false (GitOps: no cluster to read a generated secret back from): every
    credential the chart would generate is named, in one message."""
    err = template_error(
        helm,
        "--set", "generateSecrets=false",
        "--set", "shards.redis.aclUsers.enabled=true",
        "--set", "databaseRoles.enabled=true",
    )  # fmt: skip
    for name in (
        "shards.redis.auth.existingSecret",
        "auth.workerToken.existingSecret",
        "postgresql.auth.existingSecret",
        "shards.redis.aclUsers.existingSecret",
        "databaseRoles.existingSecret",
    ):
        assert name in err, f"{name} missing from:\n{err}"


def test_without_generated_secrets_named_ones_render_and_nothing_is_generated(
    helm: str, yaml_mod: ModuleType
) -> None:
    sets = [
        "--set", "generateSecrets=false",
        "--set", "shards.redis.auth.existingSecret=redis",
        "--set", "auth.workerToken.existingSecret=token",
        "--set", "postgresql.auth.existingSecret=pg",
    ]  # fmt: skip
    proc = run_helm(helm, *template_args([], sets))
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml_mod.safe_load_all(proc.stdout) if d]
    assert not [d for d in docs if d["kind"] == "Secret"]
