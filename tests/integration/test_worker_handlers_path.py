"""``shardq-worker --handlers myapp.handlers`` run (as the installed console script) from the
folder that holds ``myapp/``: the folder is on the import path, as for celery, rq and arq
workers; a module found nowhere is one line and exit code 2; an import failing inside the
user's module keeps its traceback (that is the user's bug to see)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

WORKER = Path(sys.executable).parent / "shardq-worker"


def run_worker(cwd: Path, handlers: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(WORKER), "--handlers", handlers, "--metrics-port", "-1"],
        cwd=cwd,
        # Unreachable on purpose: these tests end before the worker connects anywhere.
        env={"PATH": "/usr/bin:/bin", "SHARDQ_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/x"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def make_app(root: Path) -> Path:
    app = root / "myapp"
    app.mkdir(parents=True)
    (app / "__init__.py").write_text("")
    # Found and imported: it says so and ends the worker (no cluster in this test).
    (app / "handlers.py").write_text(
        "from shardq.worker import handler\n"
        "print('myapp.handlers imported', flush=True)\n"
        "raise SystemExit(0)\n"
    )
    (app / "broken.py").write_text("import not_installed_dependency_xyz\n")
    return root


def test_handlers_module_in_the_working_folder_is_found(tmp_path: Path) -> None:
    done = run_worker(make_app(tmp_path), "myapp.handlers")
    assert done.returncode == 0, done.stderr
    assert "myapp.handlers imported" in done.stdout


def test_a_module_found_nowhere_is_one_line_naming_it_and_where_it_looked(
    tmp_path: Path,
) -> None:
    for missing, named in (("myapp.nosuch", "myapp.nosuch"), ("nosuchapp.jobs", "nosuchapp")):
        done = run_worker(make_app(tmp_path / missing), missing)
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr
        assert lines[0].startswith(f"shardq-worker: error: --handlers: no module named {named}")
        assert f"searched: {tmp_path / missing}," in lines[0]
        assert "Traceback" not in done.stderr


def test_an_import_failing_inside_the_users_module_keeps_its_traceback(tmp_path: Path) -> None:
    done = run_worker(make_app(tmp_path), "myapp.broken")
    assert done.returncode == 1
    assert "Traceback" in done.stderr
    assert "ModuleNotFoundError: No module named 'not_installed_dependency_xyz'" in done.stderr
    assert "myapp/broken.py" in done.stderr
