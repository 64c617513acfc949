"""A real dashboard process and a real Chromium for the browser tests."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

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

    def __init__(self, coordinator: str, extra_args: Sequence[str] = ()) -> None:
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
                *extra_args,
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

    def json_lines(self) -> list[dict[str, Any]]:
        """The process's structured log lines so far (stderr is merged into stdout)."""
        out = []
        for line in list(self.lines):
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
        return out

    def audit_lines(self) -> list[dict[str, Any]]:
        """The audit lines of admin actions (who, action, target, outcome)."""
        return [d for d in self.json_lines() if "action" in d and "outcome" in d]

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
async def dashboard(
    coordinator: str, extra_args: Sequence[str] = ()
) -> AsyncIterator[DashboardProcess]:
    proc = DashboardProcess(coordinator, extra_args)
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


@dataclass
class Reply:
    status: int
    headers: list[tuple[str, str]]
    body: str

    def header(self, name: str) -> str:
        return next((v for k, v in self.headers if k.lower() == name.lower()), "")

    def set_cookie(self, name: str) -> str:
        """The whole Set-Cookie header of cookie ``name`` ("" when none), attributes and all."""
        prefix = f"{name}="
        return next(
            (v for k, v in self.headers if k.lower() == "set-cookie" and v.startswith(prefix)),
            "",
        )


@dataclass
class HttpUser:
    """A user of the dashboard at the HTTP level (no browser): a cookie jar, the form fields
    that the pages carry, and headers as a proxy in front would add them. Each request runs in
    a thread: the test's cluster serves gRPC on the test's own event loop."""

    url: str
    cookies: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)

    def _request(
        self, method: str, path: str, form: dict[str, str] | None, headers: dict[str, str]
    ) -> Reply:
        parts = urlsplit(self.url)
        conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=60)
        try:
            sent = {"accept": "text/html", **self.headers, **headers}
            if self.cookies:
                sent["cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
            body = None
            if form is not None:
                body = urlencode(form)
                sent["content-type"] = "application/x-www-form-urlencoded"
            conn.request(method, path, body=body, headers=sent)
            resp = conn.getresponse()
            reply = Reply(resp.status, resp.getheaders(), resp.read().decode("utf-8", "replace"))
        finally:
            conn.close()
        for name, value in reply.headers:
            if name.lower() == "set-cookie":
                for morsel in SimpleCookie(value).values():
                    if morsel["max-age"] == "0":
                        self.cookies.pop(morsel.key, None)
                    else:
                        self.cookies[morsel.key] = morsel.value
        return reply

    async def get(self, path: str, **headers: str) -> Reply:
        return await asyncio.to_thread(self._request, "GET", path, None, headers)

    async def post(self, path: str, form: dict[str, str], **headers: str) -> Reply:
        return await asyncio.to_thread(self._request, "POST", path, form, headers)

    async def login(self, token: str) -> Reply:
        """The login form, as a browser fills it in; returns the POST's reply (303 when in)."""
        page = await self.get("/login")
        nonce = field_value(page.body, "nonce")
        return await self.post("/login", {"nonce": nonce, "token": token})

    async def csrf(self, path: str = "/jobs") -> str:
        """The CSRF token that the forms of a page carry."""
        page = await self.get(path)
        assert page.status == 200, (path, page.status, page.body)
        return field_value(page.body, "csrf")


def field_value(html: str, name: str) -> str:
    found = re.search(rf'name="{name}" value="([^"]*)"', html)
    assert found, f"no {name} field in:\n{html}"
    return found.group(1)
