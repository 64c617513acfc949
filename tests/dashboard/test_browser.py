"""The dashboard in a real Chromium, against a real cluster (Redis shards, Postgres, the gRPC
coordinator, shard loops, a worker) and a real ``shardq dashboard`` process.

Nothing is timed: handlers wait for files the test creates, and every wait is for a condition
with a generous timeout.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Callable
from pathlib import Path

from playwright.async_api import Page, expect

from shardq.client import AsyncClient, TenantLimits
from tests.dashboard import handlers as _handlers  # noqa: F401 - registers dash.* handlers
from tests.dashboard.support import chromium, dashboard, screenshot_dir
from tests.support.cluster import running_cluster
from tests.support.workers import running_worker, shard_loops

LONG = 60_000  # ms: the most any page condition may take on a loaded machine
TENANT = "acme"


async def login(page: Page, url: str, token: str) -> None:
    await page.goto(f"{url}/login")
    await page.fill("input[name=token]", token)
    async with page.expect_navigation():
        await page.click("form.login button")
    assert await page.locator("h1").text_content() != "Log in", await page.content()


async def submit(client: AsyncClient, handler: str, payload: object, **kw: object) -> str:
    submitted = await client.submit(handler, payload, **kw)
    return str(submitted.job_id)


async def test_operator_flows(database_url: str, tmp_path: Path) -> None:
    """Log in with the admin token; a job moves READY -> ACTIVE -> SUCCEEDED on its page
    without a reload; find a job by request_id; requeue a dead job (selected, confirmed) and
    see it succeed; bad input gives clear pages; a POST without the CSRF token is refused;
    the token is in no URL the browser asked for and in no line of the dashboard's log."""
    img = screenshot_dir(tmp_path)
    async with (
        running_cluster(database_url) as cluster,
        shard_loops(cluster),
        dashboard(cluster.target) as dash,
        chromium() as browser,
    ):
        client = await cluster.client(TENANT)
        admin = cluster.admin_token
        page = await browser.new_page(viewport={"width": 1200, "height": 760})
        urls: list[str] = []
        page.on("request", lambda r: urls.append(r.url))

        # A wrong token is refused with a clear message; the admin token lands on the overview.
        await page.goto(f"{dash.url}/login")
        await page.fill("input[name=token]", "sq_not_a_token")
        await page.click("form.login button")
        await expect(page.get_by_role("alert")).to_contain_text("not accepted")
        await login(page, dash.url, admin)
        await expect(page.locator("h1")).to_have_text("Overview")
        await expect(page.locator("#shard-table tbody tr")).to_have_count(2)

        release = tmp_path / "release"
        rid = f"order-{uuid.uuid4().hex[:8]}"
        job_id = await submit(
            client, "dash.gate", {"release": str(release), "note": "x" * 40}, request_id=rid
        )
        await page.goto(f"{dash.url}/tenants/{TENANT}/jobs/{job_id}")
        await expect(page.locator("#job-state")).to_have_text("READY", timeout=LONG)
        async with running_worker(cluster, handlers=["dash.gate", "dash.flaky"]):
            await live_job(page, release, img)
            await find_by_request_id(page, dash.url, rid, job_id)
            await requeue_dead(page, dash.url, client, tmp_path / "fail", img)
            await other_pages(page, dash.url, client, img)
            await limits_form(page, dash.url, await cluster.client())
        await bad_input(page, dash.url)
        await page.screenshot(path=img / "dashboard-error.png")
        await csrf_refused(page, dash.url)

        # The token never travels in a URL, nor lands in the dashboard's log.
        assert urls and not [u for u in urls if admin in u]
        assert any("/login" in line for line in dash.lines)  # the access log is on
        assert admin not in dash.output
        assert not re.search(r"Traceback", dash.output), dash.output


async def live_job(page: Page, release: Path, img: Path) -> None:
    """The open job page follows READY -> ACTIVE -> SUCCEEDED without a reload."""
    state = page.locator("#job-state")
    await page.evaluate("window.notReloaded = true")
    await expect(state).to_have_text("ACTIVE", timeout=LONG)
    await page.screenshot(path=img / "dashboard-job-active.png")
    await asyncio.to_thread(release.touch)
    await expect(state).to_have_text("SUCCEEDED", timeout=LONG)
    assert await page.evaluate("window.notReloaded") is True
    await expect(page.locator("#live")).to_contain_text('"released": true')
    await page.screenshot(path=img / "dashboard-job.png")


async def find_by_request_id(page: Page, url: str, rid: str, job_id: str) -> None:
    """The search box of every page finds a job by its request_id."""
    await page.goto(f"{url}/tenants")
    await page.fill("header input[name=tenant]", TENANT)
    await page.fill("header input[name=q]", rid)
    await page.click("header >> text=Find")
    await expect(page.locator("#request-id")).to_have_text(rid)
    assert page.url.endswith(f"/tenants/{TENANT}/jobs/{job_id}")


async def requeue_dead(
    page: Page, url: str, client: AsyncClient, fail_flag: Path, img: Path
) -> None:
    """A dead job, selected on the dead-letter page, requeued after a confirmation, succeeds."""
    await asyncio.to_thread(fail_flag.touch)
    dead_id = await submit(client, "dash.flaky", {"fail_while": str(fail_flag)}, max_attempts=1)
    await page.goto(f"{url}/tenants/{TENANT}/dead")
    row = page.locator(f"tr:has(a:text('{dead_id}'))")
    for _ in range(300):  # until the worker has run it and it is dead: reload the page
        if await row.count():
            break
        await page.wait_for_timeout(200)
        await page.reload()
    await expect(row).to_contain_text("told to fail")
    await page.screenshot(path=img / "dashboard-dead.png")
    await asyncio.to_thread(fail_flag.unlink)
    await row.locator("input[type=checkbox]").check()
    await page.click("#requeue-selected >> text=Requeue selected")
    await expect(page.locator(".question")).to_contain_text("Requeue 1 dead job")
    await page.click("#confirm")
    await expect(page.locator("h1")).to_have_text("Requeued 1 job")
    await page.click(f"text={dead_id}")
    await expect(page.locator("#job-state")).to_have_text("SUCCEEDED", timeout=LONG)


async def other_pages(page: Page, url: str, client: AsyncClient, img: Path) -> None:
    """The overview, tenants, tenant, jobs and schedules pages (screenshots for the docs)."""
    await page.goto(f"{url}/")
    await page.screenshot(path=img / "dashboard-overview.png")
    await page.goto(f"{url}/tenants?sort=completed_total&dir=desc")
    await expect(page.locator("#tenant-table")).to_contain_text(TENANT)
    await page.screenshot(path=img / "dashboard-tenants.png")
    await page.goto(f"{url}/tenants/{TENANT}")
    await expect(page.locator("#tenant-stats")).to_be_visible()
    await page.screenshot(path=img / "dashboard-tenant.png")
    await page.goto(f"{url}/jobs?tenant={TENANT}&state=dead")
    await page.screenshot(path=img / "dashboard-jobs.png")
    await client.schedule("nightly", "0 3 * * *", "dash.flaky", {"fail_while": "/x"})
    await page.goto(f"{url}/tenants/{TENANT}/schedules")
    await expect(page.locator("table")).to_contain_text("nightly")
    await page.screenshot(path=img / "dashboard-schedules.png")


async def limits_form(page: Page, url: str, admin: AsyncClient) -> None:
    """The tenant page's limits form changes what it shows and keeps what it does not
    (SetTenantLimits replaces the whole message): retention and the dedupe window stay, and
    a limit the tenant takes from the server's defaults stays a default (empty, the default
    greyed), not written into its row, where it would outlive a change of the defaults."""
    kept = TenantLimits(result_retention_s=3600, dedupe_window_s=7200)
    await admin.set_tenant_limits(kept, TENANT)
    default_pending = (await admin.tenant_limits(TENANT)).max_pending
    assert default_pending, "the cluster's coordinator has a max_pending default"
    await page.goto(f"{url}/tenants/{TENANT}")
    pending = page.locator("form.limits input[name=max_pending]")
    await expect(pending).to_have_value("")
    await expect(pending).to_have_attribute("placeholder", str(default_pending))
    await page.fill("form.limits input[name=weight]", "3")
    await page.click("form.limits button")
    await expect(page.locator(".question")).to_contain_text("Set the limits")
    await page.click("#confirm")
    now = await admin.tenant_limits(TENANT)
    assert (now.weight, now.result_retention_s, now.dedupe_window_s) == (3, 3600, 7200), now
    assert now.max_pending == default_pending
    assert await admin.tenant_limits(TENANT, stored_only=True) == TenantLimits(
        weight=3, result_retention_s=3600, dedupe_window_s=7200
    )
    await page.goto(f"{url}/tenants/{TENANT}")
    await expect(page.locator("form.limits input[name=weight]")).to_have_value("3")


async def bad_input(page: Page, url: str) -> None:
    """Clear pages with the right status, never a stack trace."""
    for path, status, text in [
        (f"/tenants/{TENANT}/jobs/nosuchjob", (400, 404), None),
        (f"/jobs?tenant={TENANT}&state=ready&page_token=garbage", (400,), "page_token"),
        (f"/jobs?tenant={TENANT}&state=nonsense", (400,), "Unknown state"),
        ("/tenants?sort=drop_table", (400,), "Cannot sort"),
        ("/tenants?page_token=x", (400,), "page_token"),
        ("/no/such/page", (404,), "No page has this address"),
    ]:
        response = await page.goto(f"{url}{path}")
        assert response is not None
        assert response.status in status, (path, response.status)
        body = await page.content()
        assert "Traceback" not in body
        if text:
            assert text in body, (path, body)


async def csrf_refused(page: Page, url: str) -> None:
    """A POST without (or with a wrong) CSRF token is refused, and nothing is requeued."""
    for form in ({"all": "1"}, {"all": "1", "csrf": "forged", "confirmed": "1"}):
        refused = await page.request.post(f"{url}/tenants/{TENANT}/dead/requeue", form=form)
        assert refused.status == 403
        assert "CSRF" in await refused.text()


async def test_tenant_token_sees_its_own_tenant_only(database_url: str, tmp_path: Path) -> None:
    """A tenant's token opens its own jobs; another tenant's job page is refused with a clear
    page (the API decides: PERMISSION_DENIED), and the admin pages are not offered."""
    async with (
        running_cluster(database_url) as cluster,
        dashboard(cluster.target) as dash,
        chromium() as browser,
    ):
        mine = await submit(await cluster.client("acme"), "dash.gate", {"release": "/x"})
        theirs = await submit(await cluster.client("globex"), "dash.gate", {"release": "/x"})
        page = await browser.new_page()
        await login(page, dash.url, await cluster.token_for("acme"))
        assert page.url.endswith("/tenants/acme")
        await page.goto(f"{dash.url}/tenants/acme/jobs/{mine}")
        await expect(page.locator("#job-state")).to_have_text("READY")

        response = await page.goto(f"{dash.url}/tenants/globex/jobs/{theirs}")
        assert response is not None and response.status == 403
        await expect(page.locator("h1")).to_have_text("Not allowed")
        assert "Traceback" not in await page.content()
        response = await page.goto(f"{dash.url}/tenants/globex/dead")
        assert response is not None and response.status == 403
        # The tenant's own search does not reach another tenant's job either.
        await page.goto(f"{dash.url}/jobs/find?q={theirs}")
        await expect(page.locator("h1")).to_have_text("Not found")
        # The admin-only pages send a tenant to its own page.
        await page.goto(f"{dash.url}/tenants")
        assert page.url.endswith("/tenants/acme")
        # An admin action with a tenant token is refused, even with a valid CSRF token.
        await page.goto(f"{dash.url}/tenants/acme")
        csrf = await page.locator("input[name=csrf]").first.get_attribute("value")
        refused = await page.request.post(
            f"{dash.url}/tenants/acme/pause", form={"csrf": csrf or "", "confirmed": "1"}
        )
        assert refused.status == 403


async def test_logout_closes_the_sessions_live_views(database_url: str, tmp_path: Path) -> None:
    """A job page following a job live (WatchJob as server-sent events) and an overview
    polling the cluster, both open in tabs of one login: logging out in a third tab closes the
    job page's stream (the page says so, the dashboard logs it) and sends the overview to the
    login page, so neither keeps asking the cluster."""
    async with (
        running_cluster(database_url) as cluster,
        dashboard(cluster.target) as dash,
        chromium() as browser,
    ):
        # No worker: the job stays READY, and only the logout can end its page's stream.
        job_id = await submit(await cluster.client(TENANT), "dash.gate", {"release": "/x"})
        context = await browser.new_context()
        job_page = await context.new_page()
        await login(job_page, dash.url, cluster.admin_token)
        await job_page.goto(f"{dash.url}/tenants/{TENANT}/jobs/{job_id}")
        await expect(job_page.locator("#job-state")).to_have_text("READY", timeout=LONG)
        # The stream is open before the logout (uvicorn logs the request as it answers it).
        await until(lambda: any(f"/jobs/{job_id}/events" in line for line in dash.lines))
        overview = await context.new_page()
        await overview.goto(f"{dash.url}/")
        await expect(overview.locator("#shard-table tbody tr")).to_have_count(2)

        other = await context.new_page()
        await other.goto(f"{dash.url}/tenants/{TENANT}")
        async with other.expect_navigation():
            await other.click("form.logout button")
        await expect(other.locator("h1")).to_have_text("Log in")

        await expect(job_page.locator("#session-ended")).to_be_visible(timeout=LONG)
        assert await job_page.locator("#live").get_attribute("data-ended") == "1"
        await expect(overview).to_have_url(f"{dash.url}/login", timeout=LONG)
        closed = f"live view of job {job_id} closed: the session of admin ended"
        await until(lambda: any(closed in line for line in dash.lines))
        assert cluster.admin_token not in dash.output


async def until(predicate: Callable[[], bool], timeout_s: float = LONG / 1000) -> None:
    """Until ``predicate()`` holds (the dashboard's output is read by a thread)."""
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await asyncio.sleep(0.05)
