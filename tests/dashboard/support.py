"""A real dashboard process and a real Chromium for the browser tests."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from playwright.async_api import Browser, async_playwright

from shardq.coordinator.dashboard.server import READY

#: Debian's chromium (`.ci/setup` installs it). Absolute: .ci/fresh-machine strips PATH.
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
#: Where the tests save their screenshots: docs/img when this variable says so (to refresh
#: the committed ones), else the test's own tmp_path.
SCREENSHOTS = "SHARDQ_DASHBOARD_SCREENSHOTS"


class DashboardProcess:
    """``python -m shardq.coordinator.dashboard`` on a free port, its output kept line by line."""

    def __init__(self, coordinator: str) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "shardq.coordinator.dashboard",
                "--dashboard-listen",
                "127.0.0.1:0",
                "--coordinator",
                coordinator,
                "--dashboard-sample-interval-s",
                "1",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        self.url = ""
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if line.startswith(READY):
                self.url = line[len(READY) :].strip().rstrip("/")
                self._ready.set()

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_ready(self, timeout_s: float = 60) -> str:
        if not self._ready.wait(timeout_s):
            raise AssertionError(f"the dashboard did not start:\n{self.output}")
        return self.url

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(10)
        assert self.proc.stdout is not None
        self.proc.stdout.close()


@asynccontextmanager
async def dashboard(coordinator: str) -> AsyncIterator[DashboardProcess]:
    proc = DashboardProcess(coordinator)
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


@asynccontextmanager
async def chromium() -> AsyncIterator[Browser]:
    """Debian's Chromium through Playwright (which gives it a fresh profile directory of its
    own). Fails, never skips, when it is not installed."""
    assert os.access(CHROMIUM, os.X_OK), (
        f"{CHROMIUM} is missing: `bash .ci/setup` installs Debian's chromium package"
    )
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            await browser.close()


def screenshot_dir(tmp_path: Path) -> Path:
    where = os.environ.get(SCREENSHOTS)
    path = Path(where) if where else tmp_path / "img"
    path.mkdir(parents=True, exist_ok=True)
    return path


def wait_for(predicate: object, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)
