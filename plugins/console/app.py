"""The console's web application (Starlette + Jinja2): pages, forms and the live-figures API.

Sessions live in this process's memory (a random cookie names one).  With ``acl=True`` every
page asks for an admin account's keys first, and every request to the cluster is signed with
them; the keys never leave the server.  Every form carries the session's CSRF token.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
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
from tidemq_console.ops import ClusterOps

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
COOKIE = "tidemq_console"


@attrs.define
class Session:
    csrf: str
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
    sessions: dict[str, Session] = {}

    def session_of(request: Request) -> tuple[Session, str | None]:
        token = request.cookies.get(COOKIE)
        if token and token in sessions:
            return sessions[token], None
        token = secrets.token_hex(24)
        session = sessions[token] = Session(csrf=secrets.token_hex(16))
        return session, token

    async def ops_of(session: Session) -> ClusterOps:
        if session.ops is None:
            session.ops = ClusterOps(
                AdminClient(
                    config.namesrv,
                    credentials=config.credentials,
                    transport_options=config.transport_options or None,
                )
            )
        return session.ops

    def render(request: Request, session: Session, template: str, **context: Any) -> HTMLResponse:
        flash, session.flash = session.flash, []
        html = env.get_template(template).render(
            request=request,
            csrf=session.csrf,
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
            session, new_token = session_of(request)
            response: Response
            if config.acl and session.ops is None and request.url.path != "/login":
                response = RedirectResponse("/login", status_code=303)
            elif request.method == "POST" and (await request.form()).get("csrf") != session.csrf:
                response = HTMLResponse("CSRF token missing or wrong: reload the page", status_code=403)
            else:
                try:
                    response = await handler(request, session)
                except (TidemqError, InvalidNameError, ValueError) as exc:
                    session.flash.append(("error", str(exc)))
                    back = request.headers.get("referer") or "/"
                    response = RedirectResponse(
                        back if back.startswith(str(request.base_url)) else "/", status_code=303
                    )
            if new_token:
                response.set_cookie(COOKIE, new_token, httponly=True, samesite="strict")
            return response

        return endpoint

    # ------------------------------------------------------------------ login
    async def login(request: Request, session: Session) -> Response:
        if request.method == "GET":
            return render(request, session, "login.html")
        form = await request.form()
        ak, sk = str(form.get("access_key", "")).strip(), str(form.get("secret_key", "")).strip()
        if not ak or not sk:
            raise ValueError("give an access key and a secret key")
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
            raise ValueError("these keys are not an admin account's on every broker") from None
        session.ops = ClusterOps(client)
        session.access_key = ak
        session.flash.append(("ok", f"signed in as {ak}"))
        return RedirectResponse("/", status_code=303)

    async def logout(request: Request, session: Session) -> Response:
        if session.ops is not None and config.acl:
            await session.ops.client.close()
            session.ops = None
            session.access_key = ""
        return RedirectResponse("/login" if config.acl else "/", status_code=303)

    # ------------------------------------------------------------------ cluster
    async def cluster(request: Request, session: Session) -> Response:
        ops = await ops_of(session)
        return render(request, session, "cluster.html", brokers=await ops.brokers())

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
        if session.producer is None:
            client = (await ops_of(session)).client
            producer = Producer(
                "CONSOLE_PRODUCER",
                namesrv=config.namesrv,
                credentials=client.credentials,
                transport_options=config.transport_options or None,
            )
            await producer.start()
            session.producer = producer
        return session.producer

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
        for session in sessions.values():
            if session.producer is not None:
                await session.producer.shutdown()
            if session.ops is not None:
                await session.ops.client.close()

    routes = [
        Route("/", page(cluster)),
        Route("/login", page(login), methods=["GET", "POST"]),
        Route("/logout", page(logout), methods=["POST"]),
        Route("/api/live", page(live)),
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
