"""The dashboard's pages: Starlette routes rendering Jinja2 templates, htmx for live parts.

Every page is a stable URL (tenant and job in the path, filters and paging in the query), so
it can be pasted into a chat. Every change (requeue, cancel, pause, limits, schedule delete)
is a POST that carries the session's CSRF token, asks for a confirmation first (the same form
again with ``confirmed=1``), and is logged, refused or done, as one structured line: who (the
role and tenant, never the token), the action, its target and the outcome (:class:`Audit`).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any
from urllib.parse import urlencode

import grpc
from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.applications import Starlette
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from shardq.common import validation
from shardq.common.errors import ShardqError
from shardq.coordinator.dashboard.api import Api
from shardq.coordinator.dashboard.samples import Sample, Samples
from shardq.coordinator.dashboard.sessions import IDLE_S, MAX_AGE_S, Session, SessionStore, same
from shardq.v1 import common_pb2

log = logging.getLogger("shardq.dashboard")

COOKIE = "shardq_session"
LOGIN_COOKIE = "shardq_login"
#: Payloads longer than this are cut on the job page (the download link has it whole).
PAYLOAD_SHOWN_BYTES = 16 * 1024
PAGE_SIZE = 50
STATES = {
    "scheduled": common_pb2.JOB_STATE_SCHEDULED,
    "ready": common_pb2.JOB_STATE_READY,
    "active": common_pb2.JOB_STATE_ACTIVE,
    "dead": common_pb2.JOB_STATE_DEAD,
}
TERMINAL = {
    common_pb2.JOB_STATE_SUCCEEDED,
    common_pb2.JOB_STATE_DEAD,
    common_pb2.JOB_STATE_CANCELLED,
}
TENANT_COLUMNS = (
    "tenant_id",
    "shard_id",
    "ready",
    "scheduled",
    "active",
    "dead",
    "submitted_per_s",
    "completed_per_s",
    "failed_per_s",
    "submitted_total",
    "completed_total",
    "failed_total",
    "weight",
)
#: gRPC codes as the HTTP status and the headline of the page that explains them.
HTTP_OF = {
    grpc.StatusCode.NOT_FOUND: (404, "Not found"),
    grpc.StatusCode.PERMISSION_DENIED: (403, "Not allowed"),
    grpc.StatusCode.INVALID_ARGUMENT: (400, "Bad request"),
    grpc.StatusCode.FAILED_PRECONDITION: (409, "Not possible now"),
    grpc.StatusCode.ALREADY_EXISTS: (409, "Already exists"),
    grpc.StatusCode.RESOURCE_EXHAUSTED: (429, "Over a limit"),
    grpc.StatusCode.UNAVAILABLE: (503, "The cluster cannot be reached"),
    grpc.StatusCode.DEADLINE_EXCEEDED: (504, "The cluster did not answer in time"),
}


#: The limits the tenant page's form sets (the others are kept as they are).
FORM_LIMITS = (
    "weight", "max_active", "submit_rate_per_s", "submit_burst", "max_pending",
    "max_pending_bytes",
)  # fmt: skip


#: Bounds on a form read before anyone is logged in, or by anyone (Starlette's defaults
#: take 1,000 fields of 1 MiB and files of any size): the dashboard's forms are small.
FORM_MAX_FIELDS = 256
FORM_MAX_PART = 64 * 1024


async def read_form(request: Request) -> FormData:
    return await request.form(max_files=0, max_fields=FORM_MAX_FIELDS, max_part_size=FORM_MAX_PART)


@dataclass(frozen=True, slots=True)
class DashboardSettings:
    coordinator: str = "127.0.0.1:50051"
    tls: bool = False
    root_certificates: bytes | None = None
    #: (key, chain) PEM: the certificate the dashboard presents to a coordinator that
    #: requires client certificates.
    client_cert: tuple[bytes, bytes] | None = field(default=None, repr=False)
    sample_interval_s: float = 5.0
    session_idle_s: float = IDLE_S
    session_max_age_s: float = MAX_AGE_S


class PageError(Exception):
    """Ends a request with a clear page (status, headline, detail); ``reason`` is how the
    audit line of a refused action names it."""

    def __init__(self, status: int, title: str, detail: str = "", reason: str = "") -> None:
        super().__init__(title)
        self.status = status
        self.title = title
        self.detail = detail
        self.reason = reason or title.lower()


#: API codes that mean the request was refused (what the user asked cannot be done), as
#: opposed to the cluster failing to answer.
REFUSALS = frozenset(
    {
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.UNAUTHENTICATED,
    }
)


@dataclass(slots=True)
class Audit:
    """One admin action, logged once when its request ends, whatever the ending: one JSON line
    (``config.JsonFormatter``) with ``who`` (``admin``, ``tenant:NAME`` or ``anonymous``, never
    the token), ``action``, ``target`` and ``outcome`` (``done``, ``unconfirmed``,
    ``refused: csrf``, ``refused: PERMISSION_DENIED``, ``failed: UNAVAILABLE``, ...)."""

    action: str
    target: str
    who: str = "anonymous"
    outcome: str = ""
    details: dict[str, object] = field(default_factory=dict)

    def done(self, **details: object) -> None:
        self.outcome = "done"
        self.details.update(details)

    def log(self) -> None:
        outcome = self.outcome or "done"
        extra = " ".join(f"{k}={v}" for k, v in self.details.items())
        log.log(
            logging.INFO if outcome in ("done", "unconfirmed") else logging.WARNING,
            "dashboard action %s on %s by %s: %s%s",
            self.action,
            self.target,
            self.who,
            outcome,
            f" ({extra})" if extra else "",
            extra={"who": self.who, "action": self.action, "target": self.target,
                   "outcome": outcome},
        )  # fmt: skip


def state_name(value: int) -> str:
    return common_pb2.JobState.Name(value).removeprefix("JOB_STATE_")  # type: ignore[arg-type]


def when(ms: int) -> str:
    if not ms:
        return "—"
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def pretty_json(raw: bytes, limit: int = PAYLOAD_SHOWN_BYTES) -> tuple[str, bool]:
    """(the document indented, whether it was cut to ``limit`` bytes)."""
    if not raw:
        return "null", False
    try:
        text = json.dumps(json.loads(raw), indent=2, ensure_ascii=False)
    except (ValueError, RecursionError):  # a document nested deeper than Python recurses
        text = raw.decode("utf-8", "replace")
    cut = len(text.encode()) > limit
    return (text.encode()[:limit].decode("utf-8", "ignore") if cut else text), cut


def _env() -> Environment:
    env = Environment(
        loader=PackageLoader("shardq.coordinator.dashboard", "templates"),
        autoescape=select_autoescape(["html"]),
        enable_async=False,
    )
    env.filters["state"] = state_name
    env.filters["when"] = when
    env.filters["size"] = size
    env.globals["urlencode"] = urlencode
    return env


class Dashboard:
    def __init__(self, settings: DashboardSettings) -> None:
        self.settings = settings
        self.sessions = SessionStore(
            idle_s=settings.session_idle_s, max_age_s=settings.session_max_age_s
        )
        self.samples = Samples(settings.sample_interval_s)
        self.env = _env()
        self.api: Api | None = None

    # -- plumbing ---------------------------------------------------------------------------

    @property
    def a(self) -> Api:
        assert self.api is not None, "the app's lifespan opens the API channel"
        return self.api

    def render(
        self, request: Request, name: str, status: int = 200, **context: Any
    ) -> HTMLResponse:
        session: Session | None = getattr(request.state, "session", None)
        html = self.env.get_template(name).render(
            request=request, session=session, csrf=session.csrf if session else "", **context
        )
        return HTMLResponse(html, status_code=status)

    def session_of(self, request: Request, act: Audit | None = None) -> Session:
        session = self.sessions.get(request.cookies.get(COOKIE))
        if session is None:
            raise PageError(401, "Log in first", reason="not logged in")
        request.state.session = session
        if act is not None:
            act.who = session.who
        return session

    async def form(self, request: Request, session: Session) -> FormData:
        """The POST's form, refused (403) unless it carries the session's CSRF token."""
        form = await read_form(request)
        if not same(str(form.get("csrf", "")), session.csrf):
            detail = "The form's CSRF token is missing or wrong: reload."
            raise PageError(403, "Refused", detail, reason="csrf")
        return form

    @contextlib.asynccontextmanager
    async def audit(self, action: str, target: str) -> AsyncIterator[Audit]:
        """An admin action's audit line, logged when the block ends, refused or done."""
        act = Audit(action, target)
        try:
            yield act
        except PageError as exc:
            act.outcome = f"refused: {exc.reason}"
            raise
        except grpc.aio.AioRpcError as exc:
            verdict = "refused" if exc.code() in REFUSALS else "failed"
            act.outcome = f"{verdict}: {exc.code().name}"
            raise
        except BaseException:
            act.outcome = "failed: internal error"
            raise
        finally:
            act.log()

    def tenant_of(self, session: Session, tenant: str) -> str:
        """The tenant a page is about: a tenant token's own when none is named."""
        tenant = tenant or session.tenant
        if not tenant:
            raise PageError(400, "Bad request", "Name a tenant.")
        try:
            return validation.tenant_id(tenant)
        except ShardqError as exc:
            raise PageError(400, "Bad request", str(exc)) from None

    def confirm(
        self, request: Request, form: FormData, act: Audit, what: str, danger: bool = True
    ) -> HTMLResponse | None:
        """The confirmation page, unless this POST is the confirmed one."""
        if form.get("confirmed") == "1":
            return None
        act.outcome = "unconfirmed"
        fields = [(k, str(v)) for k, v in form.multi_items() if k not in ("csrf", "confirmed")]
        return self.render(
            request,
            "confirm.html",
            what=what,
            fields=fields,
            action=request.url.path,
            danger=danger,
        )

    # -- login ------------------------------------------------------------------------------

    async def login_page(self, request: Request) -> Response:
        nonce = secrets.token_urlsafe(24)
        response = self.render(request, "login.html", nonce=nonce, error="")
        self._cookie(request, response, LOGIN_COOKIE, nonce, max_age=3600)
        return response

    async def login(self, request: Request) -> Response:
        form = await read_form(request)
        if not same(str(form.get("nonce", "")), request.cookies.get(LOGIN_COOKIE, "")):
            raise PageError(403, "Refused", "The login form expired or was not ours: reload it.")
        token = str(form.get("token", "")).strip()
        session = await self._who(token)
        if session is None:
            nonce = secrets.token_urlsafe(24)
            refused = self.render(
                request, "login.html", 401, nonce=nonce, error="That token was not accepted."
            )
            self._cookie(request, refused, LOGIN_COOKIE, nonce, max_age=3600)
            return refused
        session_id = self.sessions.create(session)
        log.info("dashboard: %s logged in", session.who)
        target = "/" if session.is_admin else f"/tenants/{session.tenant}"
        response = RedirectResponse(target, status_code=303)
        # The browser forgets the cookie when the session ends at the latest.
        self._cookie(request, response, COOKIE, session_id, int(self.sessions.max_age_s))
        response.delete_cookie(LOGIN_COOKIE)
        return response

    async def _who(self, token: str) -> Session | None:
        """The session of ``token``: admin when it may read the shard map, else the tenant
        its stats are about; None when the API refuses it."""
        if not token:
            return None
        md = (("authorization", f"Bearer {token}"),)
        try:
            await self.a.shard_map(md)
            return Session(token=token, role="admin", tenant="")
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.PERMISSION_DENIED:
                if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                    return None
                raise
        try:
            stats = await self.a.tenant_stats(md, "")
        except grpc.aio.AioRpcError as exc:
            if exc.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                return None
            raise
        return Session(token=token, role="tenant", tenant=stats.tenant_id)

    async def logout(self, request: Request) -> Response:
        session = self.session_of(request)
        await self.form(request, session)
        # Ends the session and, through Session.ended, every live stream opened under it.
        self.sessions.drop(request.cookies.get(COOKIE))
        log.info("dashboard: %s logged out", session.who)
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(COOKIE)
        return response

    @staticmethod
    def _cookie(
        request: Request, response: Response, name: str, value: str, max_age: int | None = None
    ) -> None:
        response.set_cookie(
            name,
            value,
            max_age=max_age,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path="/",
        )

    # -- overview ---------------------------------------------------------------------------

    async def overview(self, request: Request) -> Response:
        session = self.session_of(request)
        if not session.is_admin:
            return RedirectResponse(f"/tenants/{session.tenant}", status_code=303)
        status = await self.a.shard_status(session.metadata)
        return self.render(
            request, "overview.html", cluster=status, interval=self.samples.interval_s
        )

    async def overview_shards(self, request: Request) -> Response:
        session = self.session_of(request)
        if not session.is_admin:
            raise PageError(403, "Not allowed", "The overview is for the admin token.")
        status = await self.a.shard_status(session.metadata)
        return self.render(request, "_shards.html", cluster=status)

    async def series(self, request: Request) -> Response:
        session = self.session_of(request)
        if not session.is_admin:
            raise PageError(403, "Not allowed", "The overview is for the admin token.")
        return JSONResponse(self.samples.series())

    async def sample(self) -> Sample | None:
        session = self.sessions.an_admin()
        if session is None:
            return None
        status = await self.a.shard_status(session.metadata)
        reachable = [s for s in status.shards if s.reachable]
        return Sample(
            at_s=time.time(),
            submitted=sum(s.submitted_total for s in reachable),
            completed=sum(s.completed_total for s in reachable),
            failed=sum(s.failed_total for s in reachable),
            lateness_ms=max((s.due_lateness_ms for s in reachable), default=0),
        )

    # -- tenants ----------------------------------------------------------------------------

    async def tenants(self, request: Request) -> Response:
        session = self.session_of(request)
        if not session.is_admin:
            return RedirectResponse(f"/tenants/{session.tenant}", status_code=303)
        sort = request.query_params.get("sort", "tenant_id")
        if sort not in TENANT_COLUMNS:
            raise PageError(400, "Bad request", f"Cannot sort by {sort!r}.")
        descending = request.query_params.get("dir", "asc") == "desc"
        page_token = request.query_params.get("page_token", "")
        # One page of the API's listing (shard, then tenant order) per page shown, sorted
        # here: reading every tenant's rates for each view costs seconds at 1,000 tenants
        # (bench/dashboard.py), a page of PAGE_SIZE stays well under one.
        resp = await self.a.tenant_stats_page(session.metadata, PAGE_SIZE, page_token)
        rows = list(resp.tenants)
        status = await self.a.shard_status(session.metadata)

        def key(t: common_pb2.TenantStats) -> Any:
            return t.limits.weight if sort == "weight" else getattr(t, sort)

        rows.sort(key=key, reverse=descending)
        return self.render(
            request,
            "tenants.html",
            rows=rows,
            total=sum(sh.tenant_count for sh in status.shards),
            page_token=page_token,
            next_token=resp.next_page_token,
            sort=sort,
            descending=descending,
            columns=TENANT_COLUMNS,
        )

    async def tenant(self, request: Request) -> Response:
        session = self.session_of(request)
        tenant = self.tenant_of(session, request.path_params["tenant"])
        stats = await self.a.tenant_stats(session.metadata, tenant)
        recent: dict[str, list[common_pb2.Job]] = {}
        for name in ("active", "ready", "scheduled", "dead"):
            if name == "dead":
                recent[name] = list((await self.a.list_dead(session.metadata, tenant, 10, "")).jobs)
            else:
                resp = await self.a.list_jobs(session.metadata, tenant, STATES[name], 10, "")
                recent[name] = list(resp.jobs)
        queues = sorted({j.queue for jobs in recent.values() for j in jobs} | {"default"})
        # The limits form shows what the tenant's row sets (the effective value, a default,
        # as the placeholder of an empty field): sent back unchanged, it changes nothing. The
        # row is in Postgres: while it is away, the page shows the rest without the form.
        own = None
        if session.is_admin:
            try:
                own = await self.a.get_limits(session.metadata, tenant, stored_only=True)
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in (
                    grpc.StatusCode.UNAVAILABLE,
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                ):
                    raise
        return self.render(
            request,
            "tenant.html",
            tenant=tenant,
            stats=stats,
            own=own,
            recent=recent,
            queues=queues,
        )

    async def tenant_pause(self, request: Request) -> Response:
        resume = request.url.path.endswith("/resume")
        verb = "Resume" if resume else "Pause"
        async with self.audit(verb.lower(), f"tenant={request.path_params['tenant']}") as act:
            session = self.session_of(request, act)
            form = await self.form(request, session)
            self._admin_only(session)
            tenant = self.tenant_of(session, request.path_params["tenant"])
            queue = str(form.get("queue", "")).strip()
            act.target = f"tenant={tenant} queue={queue or '*'}"
            target = f"tenant {tenant}" + (f", queue {queue}" if queue else " (all its queues)")
            question = f"{verb} {target}?"
            if (page := self.confirm(request, form, act, question, not resume)) is not None:
                return page
            await self.a.pause(session.metadata, tenant, queue, resume=resume)
            act.done()
        return RedirectResponse(f"/tenants/{tenant}", status_code=303)

    async def tenant_limits(self, request: Request) -> Response:
        async with self.audit("set-limits", f"tenant={request.path_params['tenant']}") as act:
            session = self.session_of(request, act)
            form = await self.form(request, session)
            self._admin_only(session)
            tenant = self.tenant_of(session, request.path_params["tenant"])
            # SetTenantLimits replaces the whole message: the fields this form does not show
            # (retention, dedupe window) keep what the tenant's row sets, and a default stays
            # a default (stored_only: the merged limits would write today's defaults into
            # the row for good).
            limits = await self.a.get_limits(session.metadata, tenant, stored_only=True)
            try:
                for name in FORM_LIMITS:
                    kind = float if name == "submit_rate_per_s" else int
                    setattr(limits, name, kind(str(form.get(name) or 0)))
            except (TypeError, ValueError):
                detail = "Limits are whole numbers (rate: a number)."
                raise PageError(400, "Bad request", detail, reason="bad limits") from None
            question = f"Set the limits of tenant {tenant}?"
            if (page := self.confirm(request, form, act, question)) is not None:
                return page
            await self.a.set_limits(session.metadata, tenant, limits)
            act.done(limits=str(limits).replace("\n", " "))
        return RedirectResponse(f"/tenants/{tenant}", status_code=303)

    @staticmethod
    def _admin_only(session: Session) -> None:
        if not session.is_admin:
            raise PageError(
                403, "Not allowed", "This action needs the admin token.", reason="admin only"
            )

    # -- jobs -------------------------------------------------------------------------------

    async def jobs(self, request: Request) -> Response:
        session = self.session_of(request)
        q = request.query_params
        tenant = q.get("tenant", "") or session.tenant
        state = q.get("state", "ready")
        if state not in STATES:
            raise PageError(400, "Bad request", f"Unknown state {state!r}.")
        page_token = q.get("page_token", "")
        queue = q.get("queue", "")
        jobs: list[common_pb2.Job] = []
        next_token = ""
        if tenant:
            tenant = self.tenant_of(session, tenant)
            if state == "dead":
                dead = await self.a.list_dead(session.metadata, tenant, PAGE_SIZE, page_token)
                jobs, next_token = list(dead.jobs), dead.next_page_token
            else:
                resp = await self.a.list_jobs(
                    session.metadata, tenant, STATES[state], PAGE_SIZE, page_token
                )
                jobs, next_token = list(resp.jobs), resp.next_page_token
        if queue:
            # The API lists by state; the queue is a filter of the page's rows.
            jobs = [j for j in jobs if j.queue == queue]
        return self.render(
            request,
            "jobs.html",
            tenant=tenant,
            state=state,
            queue=queue,
            jobs=jobs,
            next_token=next_token,
            page_token=page_token,
            states=list(STATES),
        )

    async def find(self, request: Request) -> Response:
        """Search by job ID, else by request_id; a hit goes to the job's page."""
        session = self.session_of(request)
        tenant = self.tenant_of(session, request.query_params.get("tenant", ""))
        text = request.query_params.get("q", "").strip()
        if not text:
            raise PageError(400, "Bad request", "Type a job ID or a request_id.")
        job: common_pb2.Job | None = None
        try:
            validation.job_id(text)
            is_job_id = True
        except ShardqError:
            is_job_id = False
        if is_job_id:
            with contextlib.suppress(grpc.aio.AioRpcError):
                job = await self.a.get_job(session.metadata, tenant, job_id=text)
        if job is None:
            try:
                job = await self.a.get_job(session.metadata, tenant, request_id=text)
            except grpc.aio.AioRpcError as exc:
                if exc.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT):
                    raise PageError(
                        404,
                        "Not found",
                        f"No job of tenant {tenant} has the job ID or request_id {text!r} "
                        "(a request_id is remembered for the tenant's dedupe window).",
                    ) from None
                raise
        return RedirectResponse(f"/tenants/{job.tenant_id}/jobs/{job.job_id}", status_code=303)

    async def job(self, request: Request) -> Response:
        session = self.session_of(request)
        tenant = self.tenant_of(session, request.path_params["tenant"])
        job_id = request.path_params["job_id"]
        job = await self.a.get_job(session.metadata, tenant, job_id=job_id)
        payload, cut = pretty_json(job.payload)
        return self.render(
            request,
            "job.html",
            job=job,
            payload=payload,
            cut=cut,
            payload_size=len(job.payload),
            live=job.state not in TERMINAL,
            **self._job_parts(job),
        )

    @staticmethod
    def _job_parts(job: common_pb2.Job) -> dict[str, Any]:
        result, result_cut = pretty_json(job.result) if job.result else ("", False)
        return {"result": result, "result_cut": result_cut}

    async def job_payload(self, request: Request) -> Response:
        session = self.session_of(request)
        tenant = self.tenant_of(session, request.path_params["tenant"])
        job = await self.a.get_job(session.metadata, tenant, job_id=request.path_params["job_id"])
        return Response(
            job.payload or b"null",
            media_type="application/json",
            headers={"content-disposition": f'attachment; filename="{job.job_id}.json"'},
        )

    async def job_events(self, request: Request) -> Response:
        """Server-sent events: the job's live panel, re-rendered at every state change
        (WatchJob), until the job is terminal, the page is closed or the session ends (logout,
        expiry: then an ``ended`` event, and the WatchJob call is cancelled)."""
        session = self.session_of(request)
        tenant = self.tenant_of(session, request.path_params["tenant"])
        job_id = request.path_params["job_id"]
        call = self.a.watch(session.metadata, tenant, job_id)
        template = self.env.get_template("_job_live.html")
        sessions = self.sessions

        async def session_over() -> None:
            """Returns once the session has ended: at once on logout (the event), else at
            its deadline, which a request in the meantime may have moved on."""
            while True:
                left = sessions.deadline(session) - sessions.clock()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(left, 0.0)):
                        await session.ended.wait()
                if not sessions.alive(session):
                    return

        async def events() -> AsyncIterator[str]:
            over = asyncio.ensure_future(session_over())
            read: asyncio.Future[Any] | None = None
            try:
                while True:
                    read = asyncio.ensure_future(call.read())
                    await asyncio.wait({read, over}, return_when=asyncio.FIRST_COMPLETED)
                    if not read.done():
                        log.info(
                            "dashboard: live view of job %s closed: the session of %s ended",
                            job_id,
                            session.who,
                        )
                        yield "event: ended\ndata: ended\n\n"
                        return
                    job = read.result()
                    if job is grpc.aio.EOF:
                        return
                    html = template.render(job=job, **self._job_parts(job))
                    data = "".join(f"data: {line}\n" for line in html.splitlines())
                    yield f"event: job\n{data}\n"
                    if job.state in TERMINAL:
                        yield "event: end\ndata: end\n\n"
                        return
            except grpc.aio.AioRpcError as exc:
                yield f"event: failed\ndata: {exc.code().name}\n\n"
            finally:
                over.cancel()
                if read is not None:
                    read.cancel()
                call.cancel()

        return StreamingResponse(
            events(),
            media_type="text/event-stream",
            headers={"cache-control": "no-store", "x-accel-buffering": "no"},
        )

    async def job_cancel(self, request: Request) -> Response:
        job_id = request.path_params["job_id"]
        target = f"tenant={request.path_params['tenant']} job={job_id}"
        async with self.audit("cancel", target) as act:
            session = self.session_of(request, act)
            form = await self.form(request, session)
            tenant = self.tenant_of(session, request.path_params["tenant"])
            if (page := self.confirm(request, form, act, f"Cancel job {job_id}?")) is not None:
                return page
            await self.a.cancel(session.metadata, tenant, job_id)
            act.done()
        return RedirectResponse(f"/tenants/{tenant}/jobs/{job_id}", status_code=303)

    # -- dead letters -----------------------------------------------------------------------

    async def dead(self, request: Request) -> Response:
        session = self.session_of(request)
        tenant = self.tenant_of(session, request.path_params["tenant"])
        page_token = request.query_params.get("page_token", "")
        resp = await self.a.list_dead(session.metadata, tenant, PAGE_SIZE, page_token)
        return self.render(
            request,
            "dead.html",
            tenant=tenant,
            jobs=list(resp.jobs),
            next_token=resp.next_page_token,
            page_token=page_token,
        )

    async def requeue(self, request: Request) -> Response:
        async with self.audit("requeue", f"tenant={request.path_params['tenant']}") as act:
            session = self.session_of(request, act)
            form = await self.form(request, session)
            tenant = self.tenant_of(session, request.path_params["tenant"])
            everything = form.get("all") == "1"
            job_ids = [str(j) for j in form.getlist("job_id")]
            act.target = f"tenant={tenant} jobs={'all' if everything else ','.join(job_ids)}"
            if not everything and not job_ids:
                detail = "Select dead jobs to requeue, or requeue all."
                raise PageError(400, "Bad request", detail, reason="no jobs selected")
            what = (
                f"Requeue every dead job of tenant {tenant}?"
                if everything
                else f"Requeue {len(job_ids)} dead job{'s' if len(job_ids) != 1 else ''} "
                f"of tenant {tenant}?"
            )
            if (page := self.confirm(request, form, act, what, danger=False)) is not None:
                return page
            resp = await self.a.requeue(session.metadata, tenant, job_ids, all=everything)
            act.done(requeued=resp.requeued_count, not_found=len(resp.not_found_job_ids))
        return self.render(
            request,
            "requeued.html",
            tenant=tenant,
            count=resp.requeued_count,
            missing=list(resp.not_found_job_ids),
            job_ids=job_ids,
        )

    # -- schedules --------------------------------------------------------------------------

    async def schedules(self, request: Request) -> Response:
        session = self.session_of(request)
        tenant = self.tenant_of(session, request.path_params["tenant"])
        page_token = request.query_params.get("page_token", "")
        resp = await self.a.list_schedules(session.metadata, tenant, PAGE_SIZE, page_token)
        return self.render(
            request,
            "schedules.html",
            tenant=tenant,
            schedules=list(resp.schedules),
            next_token=resp.next_page_token,
        )

    async def schedule_delete(self, request: Request) -> Response:
        schedule_id = request.path_params["schedule_id"]
        target = f"tenant={request.path_params['tenant']} schedule={schedule_id}"
        async with self.audit("delete-schedule", target) as act:
            session = self.session_of(request, act)
            form = await self.form(request, session)
            tenant = self.tenant_of(session, request.path_params["tenant"])
            question = f"Delete schedule {schedule_id} of tenant {tenant}?"
            if (page := self.confirm(request, form, act, question)) is not None:
                return page
            await self.a.delete_schedule(session.metadata, tenant, schedule_id)
            act.done()
        return RedirectResponse(f"/tenants/{tenant}/schedules", status_code=303)

    # -- errors -----------------------------------------------------------------------------

    def error_page(self, request: Request, status: int, title: str, detail: str) -> Response:
        if status == 401:
            if "text/html" in request.headers.get("accept", ""):
                return RedirectResponse("/login", status_code=303)
            # A poll (htmx, the charts' fetch) or an EventSource reconnecting: a redirect would
            # be followed to the login page and swapped into the page, or polled on for ever.
            # A 401 stops an EventSource for good, and htmx follows HX-Redirect with the whole
            # page, which ends its polling.
            return Response("Log in again", status_code=401, headers={"hx-redirect": "/login"})
        return self.render(request, "error.html", status, title=title, detail=detail)


Handler = Callable[[Request], Awaitable[Response]]


def _guarded(dash: Dashboard, handler: Handler) -> Handler:
    """``handler``, with every failure turned into a clear page: gRPC statuses into their
    HTTP status, anything unexpected into a 500 that names no internals (logged here)."""

    async def guarded(request: Request) -> Response:
        try:
            return await handler(request)
        except PageError as exc:
            return dash.error_page(request, exc.status, exc.title, exc.detail)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                dash.sessions.drop(request.cookies.get(COOKIE))
                return dash.error_page(request, 401, "Log in again", "")
            status, title = HTTP_OF.get(exc.code(), (502, "The cluster refused the request"))
            return dash.error_page(request, status, title, exc.details() or "")
        except HTTPException:
            raise
        except Exception:
            log.exception("dashboard: %s %s failed", request.method, request.url.path)
            return dash.error_page(
                request, 500, "Something went wrong", "The dashboard's log has the details."
            )

    return guarded


async def healthz(request: Request) -> Response:
    """Liveness of the dashboard process itself (probes, ``shardq dev``): it asks the
    coordinator nothing, so a coordinator away does not restart the dashboard."""
    return JSONResponse({"status": "ok"})


def create_app(settings: DashboardSettings) -> Starlette:
    dash = Dashboard(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        dash.api = Api(
            settings.coordinator,
            tls=settings.tls,
            root_certificates=settings.root_certificates,
            client_cert=settings.client_cert,
        )
        sampler = asyncio.create_task(dash.samples.run(dash.sample))
        try:
            yield
        finally:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
            await dash.api.close()

    def r(path: str, handler: Handler, methods: tuple[str, ...] = ("GET",)) -> Route:
        return Route(path, _guarded(dash, handler), methods=list(methods))

    post = ("POST",)
    static = str(resources.files("shardq.coordinator.dashboard") / "static")
    routes = [
        r("/", dash.overview),
        Route("/healthz", healthz),
        r("/login", dash.login_page),
        r("/login", dash.login, post),
        r("/logout", dash.logout, post),
        r("/overview/shards", dash.overview_shards),
        r("/overview/series.json", dash.series),
        r("/tenants", dash.tenants),
        r("/tenants/{tenant}", dash.tenant),
        r("/tenants/{tenant}/pause", dash.tenant_pause, post),
        r("/tenants/{tenant}/resume", dash.tenant_pause, post),
        r("/tenants/{tenant}/limits", dash.tenant_limits, post),
        r("/jobs", dash.jobs),
        r("/jobs/find", dash.find),
        r("/tenants/{tenant}/jobs/{job_id}", dash.job),
        r("/tenants/{tenant}/jobs/{job_id}/payload.json", dash.job_payload),
        r("/tenants/{tenant}/jobs/{job_id}/events", dash.job_events),
        r("/tenants/{tenant}/jobs/{job_id}/cancel", dash.job_cancel, post),
        r("/tenants/{tenant}/dead", dash.dead),
        r("/tenants/{tenant}/dead/requeue", dash.requeue, post),
        r("/tenants/{tenant}/schedules", dash.schedules),
        r("/tenants/{tenant}/schedules/{schedule_id}/delete", dash.schedule_delete, post),
        Mount("/static", StaticFiles(directory=static, follow_symlink=True), name="static"),
    ]

    async def not_found(request: Request, exc: Exception) -> Response:
        return dash.error_page(request, 404, "Not found", "No page has this address.")

    async def not_allowed(request: Request, exc: Exception) -> Response:
        return dash.error_page(request, 405, "Method not allowed", "")

    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={404: not_found, 405: not_allowed},
    )
    app.state.dashboard = dash
    return app
