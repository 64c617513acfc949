"""The image the chart runs can be built from this repository: deploy/build-image.sh builds
deploy/Dockerfile, tagged with the chart's appVersion (what the chart runs when image.tag is
empty). No container engine runs here, so the build itself is not run: the script's syntax,
help, tag and the commands it would run are, and every file the Dockerfile copies exists and
reaches the build context."""

from __future__ import annotations

import fnmatch
import os
import shlex
import subprocess
import tomllib
from collections.abc import Callable
from types import ModuleType

import pytest

from tests.helm.conftest import CHART, ROOT, Rendered
from tests.helm.test_chart import FULLNAME, container

Render = Callable[[str], Rendered]
SCRIPT = ROOT / "deploy" / "build-image.sh"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"


def run_script(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    # Without the caller's SHARDQ_IMAGE_* variables, which change the defaults.
    base = {k: v for k, v in os.environ.items() if not k.startswith("SHARDQ_IMAGE_")}
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env={**base, **env},
        cwd="/",  # the script finds the repository from its own path
    )


def chart_meta(yaml_mod: ModuleType) -> tuple[str, str]:
    """(appVersion, image.repository) as the chart has them."""
    chart = yaml_mod.safe_load((CHART / "Chart.yaml").read_text())
    values = yaml_mod.safe_load((CHART / "values.yaml").read_text())
    return str(chart["appVersion"]), str(values["image"]["repository"])


def test_the_script_is_valid_bash_and_executable() -> None:
    proc = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert os.access(SCRIPT, os.X_OK)


def test_help_says_how_to_use_it(yaml_mod: ModuleType) -> None:
    proc = run_script("--help")
    assert proc.returncode == 0, proc.stderr
    app_version, repository = chart_meta(yaml_mod)
    for expected in ("--repository", "--tag", "--push", "--dry-run", app_version, repository):
        assert expected in proc.stdout, f"{expected!r} missing from --help:\n{proc.stdout}"


def test_the_tag_is_the_charts_app_version_and_the_image_the_chart_runs(
    yaml_mod: ModuleType, render: Render
) -> None:
    app_version, repository = chart_meta(yaml_mod)
    proc = run_script("--print-tag")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"{repository}:{app_version}"
    # What the chart's pods run by default is exactly what the script builds.
    dep = render("default").get("Deployment", f"{FULLNAME}-coordinator")
    image = container(dep["spec"]["template"]["spec"], "coordinator")["image"]
    assert image == proc.stdout.strip()
    # Another repository keeps the tag.
    other = run_script("--print-tag", SHARDQ_IMAGE_REPOSITORY="registry.example.com/shardq")
    assert other.stdout.strip() == f"registry.example.com/shardq:{app_version}"


@pytest.mark.parametrize("tool", ["docker", "podman", "buildah"])
def test_it_builds_the_dockerfile_from_the_root_and_pushes_only_when_asked(
    yaml_mod: ModuleType, tool: str
) -> None:
    app_version, _ = chart_meta(yaml_mod)
    image = f"registry.example.com/shardq:{app_version}"
    common = ["--dry-run", "--tool", tool, "--repository", "registry.example.com/shardq"]

    proc = run_script(*common)
    assert proc.returncode == 0, proc.stderr
    (build,) = [shlex.split(line) for line in proc.stdout.splitlines()]
    assert build[:2] == [tool, "build"]
    assert build[build.index("-f") + 1] == str(DOCKERFILE)
    assert build[build.index("-t") + 1] == image
    assert f"org.opencontainers.image.version={app_version}" in build
    assert build[-1] == str(ROOT), "the build context is the repository root"

    pushed = run_script(*common, "--push")
    assert pushed.returncode == 0, pushed.stderr
    lines = [shlex.split(line) for line in pushed.stdout.splitlines()]
    assert lines == [build, [tool, "push", image]]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--bogus"], "unknown option: --bogus"),
        (["--repository"], "--repository needs a value"),
        (["--repository", "Not/Lower"], "--repository Not/Lower is not an image repository"),
        (["--tag", "a tag"], "--tag a tag is not an image tag"),
        (["--tool", "kaniko", "--dry-run"], "--tool kaniko: expected docker, podman or buildah"),
    ],
)
def test_bad_arguments_are_usage_errors(args: list[str], message: str) -> None:
    proc = run_script(*args)
    assert proc.returncode == 2, proc
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def copy_sources() -> list[str]:
    """The sources of the Dockerfile's COPY instructions from the build context."""
    sources: list[str] = []
    for line in DOCKERFILE.read_text().splitlines():
        words = line.split()
        if not words or words[0].upper() != "COPY":
            continue
        args = [w for w in words[1:] if not w.startswith("--")]
        if any(w.startswith("--from") for w in words[1:]):
            continue  # from another stage, not from the repository
        sources += args[:-1]
    return sources


def test_every_file_the_dockerfile_copies_exists_and_reaches_the_context() -> None:
    sources = copy_sources()
    assert {"pyproject.toml", "proto", "coordinator", "shard", "worker"} <= set(sources)
    rules = [
        r.strip()
        for r in (ROOT / ".dockerignore").read_text().splitlines()
        if r.strip() and not r.startswith("#")
    ]
    for source in sources:
        matches = list(ROOT.glob(source))
        assert matches, f"COPY {source}: nothing in the repository matches"
        for path in matches:
            relative = path.relative_to(ROOT).as_posix()
            assert in_context(relative, rules), (
                f"COPY {source}: .dockerignore leaves out {relative}"
            )


def in_context(relative: str, rules: list[str]) -> bool:
    """Docker's rule: the last .dockerignore pattern that matches decides (`!` keeps)."""
    keep = True
    for rule in rules:
        negated = rule.startswith("!")
        pattern = rule.removeprefix("!").rstrip("/")
        top = relative.split("/", maxsplit=1)[0]
        if fnmatch.fnmatch(relative, pattern) or fnmatch.fnmatch(top, pattern):
            keep = negated
    return keep


def test_the_package_inside_has_the_charts_version(yaml_mod: ModuleType) -> None:
    """The tag says what is inside: pyproject's version and the chart's appVersion agree."""
    app_version, _ = chart_meta(yaml_mod)
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["version"] == app_version
