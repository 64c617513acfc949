"""The dashboard at the HTTP level, against a real cluster and a real ``shardq dashboard``
process: cookies and headers as a TLS-terminating proxy in front sees them, the audit line of
every admin action (read from the process's own log), a coordinator that requires client
certificates, and a live view that ends with its session.

Nothing is timed: every wait is for a condition, with a generous timeout.
"""

from __future__ import annotations

import asyncio
import http.client
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tests.dashboard import handlers as _handlers  # noqa: F401 - registers dash.* handlers
from tests.dashboard.support import DashboardProcess, HttpUser, dashboard
from tests.integration.test_coordinator_tls import pki  # noqa: F401 - the fixture
from tests.support.cluster import running_cluster
from tests.support.outage import proxied_database

HTTPS = {"x-forwarded-proto": "https"}


async def eventually(predicate: Callable[[], bool], timeout_s: float = 60) -> None:
    """Until ``predicate()`` holds (the dashboard's log is read by a thread)."""
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await asyncio.sleep(0.05)


def attributes(set_cookie: str) -> set[str]:
    """The attributes of a Set-Cookie header, lower case, without values."""
    return {part.strip().split("=")[0].lower() for part in set_cookie.split(";")[1:]}


async def test_the_session_cookie_is_secure_behind_a_tls_proxy_it_trusts_only(
    database_url: str,
) -> None:
    """Behind a proxy named in --forwarded-allow-ips, X-Forwarded-Proto: https makes the
    session cookie Secure although the dashboard serves plain HTTP; by default (no proxy
    named) the same header from the same peer is ignored."""
    async with (
        running_cluster(database_url) as cluster,
        dashboard(cluster.target, ["--forwarded-allow-ips", "127.0.0.1"]) as behind,
        dashboard(cluster.target) as alone,
    ):
        admin = cluster.admin_token

        user = HttpUser(behind.url, headers=HTTPS)
        reply = await user.login(admin)
        assert reply.status == 303, reply.body
        cookie = reply.set_cookie("shardq_session")
        assert {"secure", "httponly", "samesite", "max-age"} <= attributes(cookie), cookie
        assert "samesite=strict" in cookie.lower()
        # A plain-HTTP user of the same dashboard (no header): no Secure, or the browser would
        # never send the cookie back over HTTP.
        plain = await HttpUser(behind.url).login(admin)
        assert "secure" not in attributes(plain.set_cookie("shardq_session"))

        # Nobody trusted: the header is anybody's to send, and does not count.
        forged = await HttpUser(alone.url, headers=HTTPS).login(admin)
        assert forged.status == 303, forged.body
        cookie = forged.set_cookie("shardq_session")
        assert cookie and "secure" not in attributes(cookie), cookie

    assert admin not in behind.output and admin not in alone.output


async def test_every_admin_action_is_logged_done_or_refused(database_url: str) -> None:
    """One structured line per admin action, refused ones included: who (never the token),
    action, target, outcome."""
    async with running_cluster(database_url) as cluster, dashboard(cluster.target) as dash:
        acme_job = (await (await cluster.client("acme")).submit("dash.gate", {})).job_id
        globex_job = (await (await cluster.client("globex")).submit("dash.gate", {})).job_id
        admin = HttpUser(dash.url)
        assert (await admin.login(cluster.admin_token)).status == 303
        acme_token = await cluster.token_for("acme")
        tenant = HttpUser(dash.url)
        assert (await tenant.login(acme_token)).status == 303
        csrf = await admin.csrf()
        tenant_csrf = await tenant.csrf()

        cancel_acme = f"/tenants/acme/jobs/{acme_job}/cancel"
        steps = [
            # (user, path, form, expected status, (who, action, target, outcome))
            (HttpUser(dash.url), cancel_acme, {"confirmed": "1"}, 303,
             ("anonymous", "cancel", f"tenant=acme job={acme_job}", "refused: not logged in")),
            (admin, cancel_acme, {"confirmed": "1"}, 403,
             ("admin", "cancel", f"tenant=acme job={acme_job}", "refused: csrf")),
            (admin, cancel_acme, {"csrf": "forged", "confirmed": "1"}, 403,
             ("admin", "cancel", f"tenant=acme job={acme_job}", "refused: csrf")),
            (admin, cancel_acme, {"csrf": csrf}, 200,
             ("admin", "cancel", f"tenant=acme job={acme_job}", "unconfirmed")),
            # globex's job asked for under acme: the API answers NOT_FOUND.
            (admin, f"/tenants/acme/jobs/{globex_job}/cancel", {"csrf": csrf, "confirmed": "1"},
             404, ("admin", "cancel", f"tenant=acme job={globex_job}", "refused: NOT_FOUND")),
            (tenant, f"/tenants/globex/jobs/{globex_job}/cancel",
             {"csrf": tenant_csrf, "confirmed": "1"}, 403,
             ("tenant:acme", "cancel", f"tenant=globex job={globex_job}",
              "refused: PERMISSION_DENIED")),
            (tenant, "/tenants/acme/pause", {"csrf": tenant_csrf, "confirmed": "1"}, 403,
             ("tenant:acme", "pause", "tenant=acme", "refused: admin only")),
            (admin, "/tenants/acme/dead/requeue", {"csrf": csrf, "confirmed": "1"}, 400,
             ("admin", "requeue", "tenant=acme jobs=", "refused: no jobs selected")),
            (admin, "/tenants/acme/schedules/nightly/delete", {"csrf": csrf, "confirmed": "1"},
             404, ("admin", "delete-schedule", "tenant=acme schedule=nightly",
                   "refused: NOT_FOUND")),
            (admin, "/tenants/acme/pause", {"csrf": csrf, "queue": "mail", "confirmed": "1"},
             303, ("admin", "pause", "tenant=acme queue=mail", "done")),
            (admin, cancel_acme, {"csrf": csrf, "confirmed": "1"}, 303,
             ("admin", "cancel", f"tenant=acme job={acme_job}", "done")),
        ]  # fmt: skip
        for n, (user, path, form, status, expected) in enumerate(steps, 1):
            reply = await user.post(path, form)
            assert reply.status == status, (path, form, reply.status, reply.body)
            await eventually(lambda n=n: len(dash.audit_lines()) >= n)  # type: ignore[misc]
            line = dash.audit_lines()[n - 1]
            got = (line["who"], line["action"], line["target"], line["outcome"])
            assert got == expected, line
            assert line["logger"] == "shardq.dashboard"
            quiet = expected[3] in ("done", "unconfirmed")
            assert line["level"] == ("INFO" if quiet else "WARNING"), line

    for token in (cluster.admin_token, acme_token):
        assert token not in dash.output
    assert "Traceback" not in dash.output, dash.output


async def test_a_coordinator_that_requires_client_certificates(
    database_url: str,
    pki: Path,  # noqa: F811 - the fixture imported above
) -> None:
    """With mTLS on the coordinator, the dashboard presents the certificate it is given: the
    admin logs in (the login itself is an API call) and the overview shows the shards."""
    tls: dict[str, Any] = {
        "tls_cert_file": str(pki / "server.pem"),
        "tls_key_file": str(pki / "server.key"),
        "tls_client_ca_file": str(pki / "ca.pem"),
    }
    certs = [
        "--ca-file", str(pki / "ca.pem"),
        "--client-cert-file", str(pki / "client.pem"),
        "--client-key-file", str(pki / "client.key"),
    ]  # fmt: skip
    async with (
        running_cluster(database_url, **tls) as cluster,
        dashboard(cluster.target, certs) as dash,
    ):
        user = HttpUser(dash.url)
        reply = await user.login(cluster.admin_token)
        assert (reply.status, reply.header("location")) == (303, "/"), reply.body
        overview = await user.get("/")
        assert overview.status == 200 and 'id="shard-table"' in overview.body, overview.body


def read_events(url: str, path: str, cookie: str) -> list[str]:
    """An EventSource's request: the stream's lines until the server closes it."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=120)
    try:
        conn.request("GET", path, headers={"accept": "text/event-stream", "cookie": cookie})
        resp = conn.getresponse()
        assert resp.status == 200, (resp.status, resp.read())
        return [line.decode().rstrip("\n") for line in resp]
    finally:
        conn.close()


async def test_a_live_view_closes_when_its_session_reaches_its_lifetime(
    database_url: str,
) -> None:
    """A job page's live stream (WatchJob behind server-sent events) of a job that never
    ends is closed by the dashboard when the session's lifetime is up, without any request
    coming: an ``ended`` event, then the end of the stream. The session is over after it."""
    # Long enough for the login and the stream's opening on a slow machine (milliseconds).
    lifetime_s = 6.0
    async with (
        running_cluster(database_url) as cluster,
        dashboard(cluster.target, ["--dashboard-session-max-age-s", str(lifetime_s)]) as dash,
    ):
        job_id = (await (await cluster.client("acme")).submit("dash.gate", {})).job_id
        user = HttpUser(dash.url)
        logged_in = time.monotonic()
        assert (await user.login(cluster.admin_token)).status == 303
        cookie = f"shardq_session={user.cookies['shardq_session']}"
        events = f"/tenants/acme/jobs/{job_id}/events"
        # No worker runs: the job stays READY and only the session can end the stream.
        lines = await asyncio.to_thread(read_events, dash.url, events, cookie)
        assert lines[0] == "event: job", lines
        assert lines[-3:] == ["event: ended", "data: ended", ""], lines
        # Closed by the lifetime, not before it (the session began at the login's answer).
        assert time.monotonic() - logged_in >= lifetime_s
        closed = f"live view of job {job_id} closed"
        await eventually(lambda: any(closed in d["msg"] for d in dash.json_lines()))

        again = await user.get(events, accept="text/event-stream")
        assert again.status == 401 and again.header("hx-redirect") == "/login"
        page = await user.get(f"/tenants/acme/jobs/{job_id}")
        assert (page.status, page.header("location")) == (303, "/login")


async def test_an_admins_tenant_page_shows_while_postgres_is_away(database_url: str) -> None:
    """The tenant page reads the stats from the shards, and its limits form the tenant's row
    from Postgres: with Postgres cut off, the page still answers, with the limits shown and
    no form, and the form is back with Postgres."""
    async with (
        proxied_database(database_url) as (proxy, proxied_url),
        running_cluster(proxied_url) as cluster,
        dashboard(cluster.target) as dash,
    ):
        user = HttpUser(dash.url)
        assert (await user.login(cluster.admin_token)).status == 303
        before = await user.get("/tenants/acme")
        assert before.status == 200 and 'class="limits"' in before.body, before.body
        proxy.cut()
        try:
            during = await user.get("/tenants/acme")
        finally:
            proxy.restore()
        assert during.status == 200, during.body
        assert 'class="limits"' not in during.body and "limits-away" in during.body
        assert "max pending 1000000" in during.body
        after = await user.get("/tenants/acme")
        assert after.status == 200 and 'class="limits"' in after.body


async def test_flags_out_of_range_are_refused() -> None:
    """A lifetime of 0, a malformed proxy address or a certificate without its key stops the
    dashboard at its start, saying which flag (a typo in --forwarded-allow-ips would otherwise
    trust nobody, silently)."""
    for args, word in (
        (["--dashboard-session-max-age-s", "0"], "--dashboard-session-max-age-s"),
        (["--forwarded-allow-ips", "10.0.0.0/8,ingress"], "--forwarded-allow-ips"),
        (["--client-cert-file", "/x.pem"], "--client-key-file"),
    ):
        proc = DashboardProcess("127.0.0.1:1", args)
        code = await asyncio.to_thread(proc.proc.wait, 60)
        proc.stop()
        assert code == 1 and word in proc.output, (args, proc.output)
