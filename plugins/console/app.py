"""The console's web application (Starlette + Jinja2): pages, forms and the live-figures API.

Sessions live in this process's memory (a random cookie names one).  A session is made only by
a login or a form post, never by a page view: a page seen without a session carries a CSRF token
derived from a cookie that names no server-side state, so a flood of cookie-less requests costs
nothing.  Sessions are capped and expire (:class:`tidemq_console.guard.SessionStore`); logging in
always starts a new session id.  With ``acl=True`` every page asks for an admin account's keys
first (failed logins are throttled), every request to the cluster is signed with them, and the
keys never leave the server.  Without it, all sessions share one admin client and one producer.
Every form carries the CSRF token.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import hmac
import logging
import re
import secrets
import typing
from collections.abc import AsyncIterator, Awaitable, Callable
from html import escape
from pathlib import Path
from typing import Any

import attrs
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from tidemq import __version__
from tidemq.client import AdminClient, AdminError, Message, Producer, SessionCredentials
from tidemq.errors import TidemqError
from tidemq.message import Prop
from tidemq.names import InvalidNameError, check_topic_name
from tidemq.remoting.codes import RequestCode
from tidemq_console.guard import LoginThrottle, SessionStore
from tidemq_console.ops import ClusterOps

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
COOKIE = "tidemq_console"
_TOKEN = re.compile(r"[0-9a-f]{48}")


@attrs.define
class Session:
    ops: ClusterOps | None = None
    producer: Producer | None = None
    access_key: str = ""
    flash: list[tuple[str, str]] = attrs.field(factory=list)  # (kind, text) shown once


@attrs.define
class ConsoleConfig:
    namesrv: str
    #: The brokers run the plain ACL: ask for an admin account's keys before anything else.
    acl: bool = False
    #: Keys given on the command line (used for every session when ``acl`` is off).
    credentials: SessionCredentials | None = None
    transport_options: dict[str, Any] = attrs.field(factory=dict)
    #: At most this many sessions; the least recently used is dropped to make room.
    max_sessions: int = 64
    #: A session unused this long (seconds) is dropped.
    session_idle_s: float = 1800.0
    #: A session is dropped this long (seconds) after its login, used or not.
    session_lifetime_s: float = 12 * 3600.0
    #: Failed logins allowed per client address, and in all, per minute (``acl`` mode).
    login_failures_per_client: int = 5
    login_failures_overall: int = 30


def _fmt_ts(ms: int) -> str:
    if not ms or ms <= 0:
        return "-"
    return dt.datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M:%S")


def _body_text(body: bytes) -> str:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        return body.hex(" ")


def create_app(config: ConsoleConfig) -> Starlette:
    """The ASGI application; ``tidemq console`` serves it with uvicorn."""
    env = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(["html"]))
    env.filters["ts"] = _fmt_ts
    env.filters["body_text"] = _body_text
    sessions: SessionStore[Session] = SessionStore(
        config.max_sessions, config.session_idle_s, config.session_lifetime_s
    )
    throttle = LoginThrottle(config.login_failures_per_client, config.login_failures_overall)
    csrf_key = secrets.token_bytes(32)
    shared: dict[str, Any] = {}  # without acl: the one ClusterOps and Producer every session uses

    def csrf_of(token: str) -> str:
        """The CSRF token of a cookie value: nothing to store, nothing to guess."""
        return hmac.new(csrf_key, token.encode(), hashlib.sha256).hexdigest()[:32]

    async def release(session: Session) -> None:
        if session.producer is not None:
            await session.producer.shutdown()
            session.producer = None
        if session.ops is not None and config.acl:
            await session.ops.client.close()
        session.ops = None

    async def reap() -> None:
        for session in sessions.reap():
            try:
                await release(session)
            except Exception:  # a broken connection while closing must not fail the request
                log.debug("closing a dropped session failed", exc_info=True)

    async def ops_of(session: Session) -> ClusterOps:
        if config.acl:
            if session.ops is None:
                raise ValueError("sign in first")
            return session.ops
        ops = shared.get("ops")
        if ops is None:
            ops = shared["ops"] = ClusterOps(
                AdminClient(
                    config.namesrv,
                    credentials=config.credentials,
                    transport_options=config.transport_options or None,
                )
            )
        return typing.cast(ClusterOps, ops)

    def render(request: Request, session: Session, template: str, **context: Any) -> HTMLResponse:
        flash, session.flash = session.flash, []
        html = env.get_template(template).render(
            request=request,
            csrf=request.state.csrf,
            flash=flash,
            namesrv=config.namesrv,
            version=__version__,
            account=session.access_key,
            acl=config.acl,
            **context,
        )
        return HTMLResponse(html)

    def page(
        handler: Callable[[Request, Session], Awaitable[Response]], *, admin: bool = False
    ) -> Callable[[Request], Awaitable[Response]]:
        """Session, login and CSRF around a handler; cluster errors become a flash message."""

        async def endpoint(request: Request) -> Response:
            await reap()
            cookie = request.cookies.get(COOKIE, "")
            known = sessions.get(cookie) if _TOKEN.fullmatch(cookie) else None
            token = cookie if known is not None or _TOKEN.fullmatch(cookie) else secrets.token_hex(24)
            request.state.csrf = csrf_of(token)
            # A page view without a session gets a throw-away one: nothing is kept for it.
            session = known if known is not None else Session()
            response: Response
            if request.method == "POST" and (
                token != cookie
                or not hmac.compare_digest(str((await request.form()).get("csrf", "")), request.state.csrf)
            ):
                response = HTMLResponse("CSRF token missing or wrong: reload the page", status_code=403)
            elif config.acl and session.ops is None and request.url.path != "/login":
                response = RedirectResponse("/login", status_code=303)
            else:
                if known is None and request.method == "POST" and request.url.path != "/login":
                    # A form post keeps its outcome (a flash message) for the next page: a session.
                    token = secrets.token_hex(24)
                    request.state.csrf = csrf_of(token)
                    sessions.add(token, session)
                    known = session
                request.state.token = token
                try:
                    response = await handler(request, session)
                except (TidemqError, InvalidNameError, ValueError) as exc:
                    if known is None:  # nowhere to keep a message: show it now
                        text = escape(str(exc))
                        response = HTMLResponse(f'<p>{text}</p><p><a href="/">back</a></p>', 502)
                    else:
                        session.flash.append(("error", str(exc)))
                        back = request.headers.get("referer") or "/"
                        response = RedirectResponse(
                            back if back.startswith(str(request.base_url)) else "/", status_code=303
                        )
                token = getattr(request.state, "token", token)
            if token != cookie:
                response.set_cookie(COOKIE, token, httponly=True, samesite="strict")
            await reap()
            return response

        return endpoint

    # ------------------------------------------------------------------ login
    async def login(request: Request, session: Session) -> Response:
        if request.method == "GET" or not config.acl:
            return render(request, session, "login.html")
        client_host = request.client.host if request.client else "?"
        wait = throttle.retry_after(client_host)
        if wait > 0:
            session.flash.append(("error", f"too many failed logins: try again in {wait:.0f} s"))
            response = render(request, session, "login.html")
            response.status_code = 429
            response.headers["Retry-After"] = str(int(wait) + 1)
            return response
        form = await request.form()
        ak, sk = str(form.get("access_key", "")).strip(), str(form.get("secret_key", "")).strip()
        problem = "" if ak and sk else "give an access key and a secret key"
        client = None
        if not problem:
            client = AdminClient(
                config.namesrv,
                credentials=SessionCredentials(ak, sk),
                transport_options=config.transport_options or None,
            )
            try:
                # An admin-only request: a non-admin account (or wrong keys) is refused here.
                masters = await client.masters()
                for addr in masters.values():
                    await client.call(addr, RequestCode.GET_BROKER_CLUSTER_ACL_INFO)
            except AdminError:
                await client.close()
                client = None
                problem = "these keys are not an admin account's on every broker"
        if client is None:
            throttle.failed(client_host)
            log.warning("console: failed login from %s (access key %r)", client_host, ak)
            session.flash.append(("error", problem))
            response = render(request, session, "login.html")
            response.status_code = 403
            return response
        # A new session id at every login: an id planted before it (cookies are not per port)
        # never becomes a signed-in session.
        old = request.cookies.get(COOKIE, "")
        if sessions.get(old) is not None:
            sessions.drop(old)
        fresh = Session(ops=ClusterOps(client), access_key=ak)
        fresh.flash.append(("ok", f"signed in as {ak}"))
        token = secrets.token_hex(24)
        sessions.add(token, fresh)
        request.state.token = token
        return RedirectResponse("/", status_code=303)

    async def logout(request: Request, session: Session) -> Response:
        cookie = request.cookies.get(COOKIE, "")
        if sessions.get(cookie) is not None:
            sessions.drop(cookie)
        return RedirectResponse("/login" if config.acl else "/", status_code=303)

    # ------------------------------------------------------------------ cluster
    async def cluster(request: Request, session: Session) -> Response:
        ops = await ops_of(session)
        brokers = await ops.brokers()
        return render(
            request, session, "cluster.html", brokers=brokers, producers=await ops.producers(brokers)
        )

    async def live(request: Request, session: Session) -> Response:
        return JSONResponse(await (await ops_of(session)).live(request.query_params.get("group", "")))

    # ------------------------------------------------------------------ topics
    async def topics(request: Request, session: Session) -> Response:
        ops = await ops_of(session)
        show_system = request.query_params.get("system") == "1"
        return render(
            request, session, "topics.html", topics=await ops.topics(show_system), system=show_system
        )

    async def topic_create(request: Request, session: Session) -> Response:
        form = await request.form()
        topic = str(form.get("topic", "")).strip()
        check_topic_name(topic)
        queues = int(str(form.get("queues", "8")))
        perm = int(str(form.get("perm", "6")))
        if not 1 <= queues <= 1024 or perm not in (2, 4, 6):
            raise ValueError("queues must be 1-1024 and perm 2, 4 or 6")
        brokers = await (await ops_of(session)).create_topic(topic, queues, perm)
        session.flash.append(("ok", f"topic {topic} created on {', '.join(brokers)}"))
        return RedirectResponse(f"/topics/{topic}", status_code=303)

    async def topic_view(request: Request, session: Session) -> Response:
        topic = request.path_params["topic"]
        ops = await ops_of(session)
        queues = await ops.topic_queues(topic)
        return render(
            request,
            session,
            "topic.html",
            topic=topic,
            queues=queues,
            total=sum(q.max_offset for q in queues),
            scheduled=sum((await ops.scheduled()).get(topic, {}).values()),
        )

    async def scheduled(request: Request, session: Session) -> Response:
        """Timer messages waiting per topic: {"topics": {topic: {"total", "brokers": {name: n}}}}."""
        per_topic = await (await ops_of(session)).scheduled()
        return JSONResponse(
            {"topics": {t: {"total": sum(b.values()), "brokers": b} for t, b in sorted(per_topic.items())}}
        )

    async def topic_delete(request: Request, session: Session) -> Response:
        topic = request.path_params["topic"]
        await (await ops_of(session)).delete_topic(topic)
        session.flash.append(("ok", f"topic {topic} deleted"))
        return RedirectResponse("/topics", status_code=303)

    # ------------------------------------------------------------------ consumer groups
    async def groups(request: Request, session: Session) -> Response:
        ops = await ops_of(session)
        rows = []
        for group in await ops.groups():
            queues, tps = await ops.group_queues(group)
            rows.append((group, sum(q.lag for q in queues), tps, len({q.topic for q in queues})))
        return render(request, session, "groups.html", groups=rows)

    async def group_view(request: Request, session: Session) -> Response:
        group = request.path_params["group"]
        ops = await ops_of(session)
        queues, tps = await ops.group_queues(group)
        return render(
            request,
            session,
            "group.html",
            group=group,
            queues=queues,
            tps=tps,
            lag=sum(q.lag for q in queues),
            topics=sorted({q.topic for q in queues}),
            clients=await ops.group_clients(group),
        )

    async def group_reset(request: Request, session: Session) -> Response:
        group = request.path_params["group"]
        form = await request.form()
        topic = str(form.get("topic", "")).strip()
        when = str(form.get("when", "")).strip()
        if form.get("skip"):
            ts = int(dt.datetime.now().timestamp() * 1000)  # skip the backlog: move to the end
        elif when:
            ts = int(dt.datetime.fromisoformat(when).timestamp() * 1000)
        else:
            raise ValueError("choose a time to reset to")
        moved = await (await ops_of(session)).reset_offset(group, topic, ts)
        session.flash.append(("ok", f"{group} on {topic}: {moved} queue(s) reset to {_fmt_ts(ts)}"))
        return RedirectResponse(f"/groups/{group}", status_code=303)

    # ------------------------------------------------------------------ messages
    async def messages(request: Request, session: Session) -> Response:
        ops = await ops_of(session)
        q = request.query_params
        found: list[Any] | None = None
        mode = q.get("mode", "")
        topic = q.get("topic", "").strip()
        if mode == "key" and topic and q.get("key"):
            found = await ops.by_key(topic, q["key"].strip())
        elif mode == "id" and q.get("id"):
            msg = await ops.by_id(q["id"].strip(), topic)
            found = [msg] if msg is not None else []
        elif mode == "time" and topic:
            begin = dt.datetime.fromisoformat(q.get("begin") or "1970-01-01T00:00")
            end = dt.datetime.fromisoformat(q["end"]) if q.get("end") else dt.datetime.now()
            found = await ops.by_time(topic, int(begin.timestamp() * 1000), int(end.timestamp() * 1000))
        return render(request, session, "messages.html", found=found, q=q)

    async def message_view(request: Request, session: Session) -> Response:
        msg = await (await ops_of(session)).by_id(request.path_params["msg_id"])
        if msg is None:
            raise ValueError(f"no message {request.path_params['msg_id']}")
        origin = msg.properties.get(Prop.RETRY_TOPIC, "") if msg.topic.startswith("%DLQ%") else msg.topic
        return render(request, session, "message.html", msg=msg, origin=origin)

    async def message_trace(request: Request, session: Session) -> Response:
        msg_id = request.path_params["msg_id"].strip()
        trace_topic = request.query_params.get("topic", "").strip()
        if trace_topic:
            check_topic_name(trace_topic)
        trace = await (await ops_of(session)).trace(msg_id, trace_topic)
        return render(request, session, "trace.html", msg_id=msg_id, trace=trace, trace_topic=trace_topic)

    async def message_resend(request: Request, session: Session) -> Response:
        form = await request.form()
        msg = await (await ops_of(session)).by_id(str(form.get("msg_id", "")))
        if msg is None:
            raise ValueError("the message is gone")
        target = str(form.get("topic", "")).strip()
        check_topic_name(target)
        result = await (await producer_of(session)).send(
            Message(target, msg.body, tags=msg.tags, keys=list(msg.keys) or None)
        )
        session.flash.append(("ok", f"resent to {target}: {result.msg_id}"))
        return RedirectResponse("/messages", status_code=303)

    # ------------------------------------------------------------------ send
    async def producer_of(session: Session) -> Producer:
        holder: Any = session if config.acl else None
        current = session.producer if config.acl else shared.get("producer")
        if current is None:
            client = (await ops_of(session)).client
            current = Producer(
                "CONSOLE_PRODUCER",
                namesrv=config.namesrv,
                credentials=client.credentials,
                transport_options=config.transport_options or None,
            )
            await current.start()
            if holder is not None:
                holder.producer = current
            else:
                shared["producer"] = current
        return typing.cast(Producer, current)

    async def send(request: Request, session: Session) -> Response:
        if request.method == "GET":
            return render(request, session, "send.html", result=None, form={})
        form = await request.form()
        topic = str(form.get("topic", "")).strip()
        check_topic_name(topic)
        msg = Message(
            topic,
            str(form.get("body", "")).encode(),
            tags=str(form.get("tags", "")).strip() or None,
            keys=str(form.get("keys", "")).split() or None,
        )
        result = await (await producer_of(session)).send(msg)
        return render(request, session, "send.html", result=result, form=form)

    async def shutdown() -> None:
        for session in sessions.all():
            await release(session)
        await reap()
        if shared.get("producer") is not None:
            await shared["producer"].shutdown()
        if shared.get("ops") is not None:
            await shared["ops"].client.close()

    routes = [
        Route("/", page(cluster)),
        Route("/login", page(login), methods=["GET", "POST"]),
        Route("/logout", page(logout), methods=["POST"]),
        Route("/api/live", page(live)),
        Route("/api/scheduled", page(scheduled)),
        Route("/topics", page(topics)),
        Route("/topics", page(topic_create), methods=["POST"]),
        Route("/topics/{topic}", page(topic_view)),
        Route("/topics/{topic}/delete", page(topic_delete), methods=["POST"]),
        Route("/groups", page(groups)),
        Route("/groups/{group}", page(group_view)),
        Route("/groups/{group}/reset", page(group_reset), methods=["POST"]),
        Route("/messages", page(messages)),
        Route("/messages/resend", page(message_resend), methods=["POST"]),
        Route("/messages/{msg_id}", page(message_view)),
        Route("/messages/{msg_id}/trace", page(message_trace)),
        Route("/send", page(send), methods=["GET", "POST"]),
        Mount("/static", app=StaticFiles(directory=HERE / "static"), name="static"),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await shutdown()

    # Forms are small: a 1 MiB cap keeps a hostile upload from holding memory.
    return Starlette(routes=routes, lifespan=lifespan, max_body_size=1 << 20)
