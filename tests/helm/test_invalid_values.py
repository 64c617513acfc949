"""Invalid values fail `helm template` once, with a message that names every problem."""

from __future__ import annotations

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
        "tls.clientAuth: shardq-worker cannot present a client certificate",
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
