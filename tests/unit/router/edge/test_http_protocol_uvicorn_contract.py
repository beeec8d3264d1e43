"""What the door (:mod:`slm_server.router.edge.http_protocol`) relies on in uvicorn,
which documents none of it: the attributes and methods of ``HttpToolsProtocol`` and of
``RequestResponseCycle`` it reads, writes, calls or overrides, the names it imports,
and what they mean. Checked on real instances (uvicorn's own protocol on a fake
transport, and the cycle it makes for a request), so a uvicorn release that renames,
drops or changes one fails here, loudly and by name, rather than somewhere in the
router. Another test checks the tables below list everything the door's source
touches."""

from __future__ import annotations

import ast
import asyncio
import inspect
import logging
import re
from collections import deque
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any, cast

import httptools
import pytest
import uvicorn
from packaging.specifiers import SpecifierSet
from uvicorn.protocols.http import flow_control, httptools_impl
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.server import ServerState

from slm_server.router.edge import http_protocol
from slm_server.router.edge.http_protocol import DoorRequest, door_protocol
from slm_server.settings import DoorLimits
from tests.unit.router.door_client import Reading, Recording

ROOT = Path(__file__).resolve().parents[4]


def method(obj: Any) -> bool:
    return inspect.ismethod(obj)


def coroutine_method(obj: Any) -> bool:
    return inspect.ismethod(obj) and inspect.iscoroutinefunction(obj)


def kind(*types: type) -> Callable[[Any], bool]:
    def check(value: Any) -> bool:
        return isinstance(value, types)

    check.__name__ = " | ".join(t.__name__ for t in types)
    return check


# HttpToolsProtocol's attributes and methods the door reads, writes or calls (its own
# are not here), each with what it must be on a protocol that has parsed a request head.
PROTOCOL: dict[str, Callable[[Any], bool]] = {
    "loop": kind(asyncio.AbstractEventLoop),  # the door's alarms run on it
    "transport": kind(Recording),  # the connection's, as connection_made got it
    "parser": kind(httptools.HttpRequestParser),  # fed by the door's data_received
    "cycle": kind(RequestResponseCycle),  # the newest request's
    "pipeline": kind(deque),  # requests queued behind an unfinished response
    "logger": kind(logging.Logger),
    "url": kind(bytes),  # the request target, gathered by on_url
    "headers": kind(list),  # (lowercased name, value) pairs, the scope's own list
    "_should_upgrade": method,
    "handle_websocket_upgrade": method,
    "_unsupported_upgrade_warning": method,
    "send_400_response": method,
    "_unset_keepalive_if_required": method,
}

# HttpToolsProtocol's methods the door overrides and calls through ``super()`` (or, for
# ``data_received``, replaces), with their parameters.
OVERRIDDEN: dict[str, list[str]] = {
    "__init__": ["self", "config", "server_state", "app_state", "_loop"],
    "connection_made": ["self", "transport"],
    "connection_lost": ["self", "exc"],
    "pause_writing": ["self"],
    "resume_writing": ["self"],
    "data_received": ["self", "data"],
    "on_response_complete": ["self"],
    "on_message_begin": ["self"],
    "on_url": ["self", "url"],
    "on_header": ["self", "name", "value"],
    "on_headers_complete": ["self"],
    "on_body": ["self", "body"],
    "on_message_complete": ["self"],
}

# RequestResponseCycle's fields the door reads or writes, with what they must be on a
# new cycle for a request whose body is still to come.
CYCLE: dict[str, Callable[[Any], bool]] = {
    "scope": kind(dict),  # its "method", "headers", and "extensions" the door adds
    "transport": kind(Recording),  # replaced by the door with its HeldTransport
    "flow": kind(FlowControl),
    "default_headers": kind(list),
    "message_event": kind(asyncio.Event),
    "on_response": method,  # the protocol's on_response_complete
    "disconnected": lambda v: v is False,
    "keep_alive": lambda v: v is True,  # HTTP/1.1
    "waiting_for_100_continue": lambda v: v is False,
    "body": lambda v: v == b"",
    "more_body": lambda v: v is True,
    "response_started": lambda v: v is False,
    "response_complete": lambda v: v is False,
    "chunked_encoding": lambda v: v is None,
    "expected_content_length": lambda v: v == 0,
}

# FlowControl's, reached through a cycle's ``flow``.
FLOW: dict[str, Callable[[Any], bool]] = {
    "write_paused": lambda v: v is False,
    "drain": coroutine_method,
    "resume_reading": method,
}

# The names the door imports from uvicorn.
IMPORTED = {
    (flow_control, "CLOSE_HEADER"),
    (httptools_impl, "HEADER_VALUE_RE"),
    (httptools_impl, "STATUS_LINE"),
    (httptools_impl, "HttpToolsProtocol"),
    (httptools_impl, "RequestResponseCycle"),
}

POST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
    b"content-type: application/json\r\ncontent-length: 4\r\n\r\n"
)


async def never_called(scope: Any, receive: Any, send: Any) -> None:
    await asyncio.Event().wait()


def uvicorns(transport: Recording | None = None) -> HttpToolsProtocol:
    """uvicorn's own protocol (not the door) on a fake transport, connected."""
    config = uvicorn.Config(never_called, log_config=None, ws="none", lifespan="off")
    config.load()
    protocol = HttpToolsProtocol(config=config, server_state=ServerState(), app_state={})
    protocol.connection_made(transport or Recording())  # type: ignore[arg-type]
    return protocol


def cycle_for(data: bytes, transport: Recording | None = None) -> RequestResponseCycle:
    """The cycle uvicorn made for ``data``, its task cancelled (nothing runs the app)."""
    protocol = uvicorns(transport)
    protocol.data_received(data)
    for task in protocol.tasks:
        task.cancel()
    return protocol.cycle


def test_the_installed_uvicorn_is_the_pinned_one() -> None:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    pinned = re.search(r'"uvicorn([^"]*)"', text)
    assert pinned is not None
    assert version("uvicorn") in SpecifierSet(pinned.group(1)), (
        f"uvicorn {version('uvicorn')} is outside the range the door was written against "
        f"({pinned.group(1)}): check "
        "tests/unit/router/edge/test_http_protocol_uvicorn_contract.py first"
    )


def test_the_names_the_door_imports_exist() -> None:
    missing = [f"{m.__name__}.{n}" for m, n in IMPORTED if not hasattr(m, n)]
    assert missing == []
    assert flow_control.CLOSE_HEADER == (b"connection", b"close")
    assert httptools_impl.STATUS_LINE[200] == b"HTTP/1.1 200 OK\r\n"
    assert httptools_impl.HEADER_VALUE_RE.search(b"a\nb")
    assert not httptools_impl.HEADER_VALUE_RE.search(b"a\tb c")
    assert HttpToolsProtocol in door_protocol(DoorLimits()).__mro__


@pytest.mark.parametrize("name", sorted(OVERRIDDEN))
def test_each_overridden_method_is_uvicorns_with_its_parameters(name: str) -> None:
    found = getattr(HttpToolsProtocol, name, None)
    assert callable(found), f"HttpToolsProtocol.{name} is gone"
    assert list(inspect.signature(found).parameters) == OVERRIDDEN[name], name


def test_each_protocol_attribute_exists_with_its_kind() -> None:
    async def run() -> None:
        protocol = uvicorns()
        protocol.data_received(POST)
        for task in protocol.tasks:
            task.cancel()
        wrong = {n: type(getattr(protocol, n, None)).__name__ for n, ok in PROTOCOL.items()}
        wrong = {n: t for n, t in wrong.items() if not PROTOCOL[n](getattr(protocol, n, None))}
        assert wrong == {}, f"HttpToolsProtocol attributes missing or changed: {wrong}"
        assert protocol.url == b"/v1/chat/completions"
        assert protocol.headers is protocol.cycle.scope["headers"]
        assert (b"content-length", b"4") in protocol.headers

    asyncio.run(run())


def test_each_cycle_field_exists_with_its_meaning_on_a_new_cycle() -> None:
    async def run() -> None:
        transport = Recording()
        cycle = cycle_for(POST, transport)
        wrong = {
            n: repr(getattr(cycle, n, "<missing>"))
            for n, ok in CYCLE.items()
            if not ok(getattr(cycle, n, None))
        }
        assert wrong == {}, f"RequestResponseCycle fields missing or changed: {wrong}"
        assert cycle.transport is cast(Any, transport)
        assert cycle.scope["method"] == "POST"
        flow = cycle.flow
        wrong = {
            n: repr(getattr(flow, n, None))
            for n, ok in FLOW.items()
            if not ok(getattr(flow, n, None))
        }
        assert wrong == {}, f"FlowControl attributes missing or changed: {wrong}"

    asyncio.run(run())


def test_the_table_lists_everything_the_door_touches() -> None:
    """Every attribute the door's source reads or writes on uvicorn's protocol (``self``
    in the door class, but for what the door defines itself), on a cycle and on a
    cycle's ``flow`` is in the tables above."""
    tree = ast.parse(Path(http_protocol.__file__).read_text(encoding="utf-8"))
    [door] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "_Door"]
    own = {n.name for n in door.body if isinstance(n, ast.FunctionDef)}
    own |= {
        t.attr
        for n in ast.walk(door)
        if isinstance(n, (ast.Assign, ast.AnnAssign))
        for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
    }
    own |= {"limits"}
    on_self = {
        n.attr
        for n in ast.walk(door)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self"
    }
    cycles = {"cycle", "before", "current", "c"}  # the names the door gives a cycle

    def is_cycle(node: ast.expr) -> bool:
        if isinstance(node, ast.Name):
            return node.id in cycles
        return isinstance(node, ast.Attribute) and node.attr == "cycle"

    on_cycle = {
        n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and is_cycle(n.value)
    }
    on_flow = {
        n.attr
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute)
        and isinstance(n.value, ast.Attribute)
        and n.value.attr == "flow"
        and is_cycle(n.value.value)
    }
    assert on_self - own - set(OVERRIDDEN) - set(PROTOCOL) == set()
    assert on_cycle - set(CYCLE) == set()
    assert on_flow - set(FLOW) == set()


# -- what the fields mean: uvicorn's own receive and send leave them as the door does --


def test_uvicorns_receive_leaves_the_cycle_as_take_body_does() -> None:
    async def run() -> None:
        theirs_transport, mine_transport = Reading(), Reading()
        theirs = cycle_for(POST + b"{}{}", theirs_transport)
        mine = cycle_for(POST + b"{}{}", mine_transport)
        for cycle in (theirs, mine):  # as uvicorn pauses it past its high-water mark
            cycle.flow.pause_reading()
        message = cast(dict[str, Any], await theirs.receive())
        body = DoorRequest(mine).take_body()
        assert (message["body"], message["more_body"]) == (body, False) == (b"{}{}", False)
        for cycle in (theirs, mine):
            assert cycle.body == b""
            assert not cycle.message_event.is_set()
        assert theirs_transport.resumed == mine_transport.resumed == 1

    asyncio.run(run())


def fields(cycle: RequestResponseCycle) -> dict[str, Any]:
    return {
        "response_started": cycle.response_started,
        "response_complete": cycle.response_complete,
        "chunked_encoding": cycle.chunked_encoding,
        "expected_content_length": cycle.expected_content_length,
        "keep_alive": cycle.keep_alive,
        "waiting_for_100_continue": cycle.waiting_for_100_continue,
        "message_event": cycle.message_event.is_set(),
    }


@pytest.mark.parametrize("close", [False, True])
def test_uvicorns_send_leaves_the_cycle_as_a_door_answer_does(close: bool) -> None:
    asked = b"connection: close\r\n" if close else b""
    request = POST.replace(b"\r\n\r\n", b"\r\n" + asked + b"\r\n") + b"{}{}"

    async def run() -> None:
        theirs_transport, mine_transport = Recording(), Recording()
        theirs = cycle_for(request, theirs_transport)
        mine = cycle_for(request, mine_transport)
        for cycle in (theirs, mine):
            cycle.message_event.clear()  # as after the body was read
        completed: list[str] = []
        theirs.on_response = lambda: completed.append("theirs")
        mine.on_response = lambda: completed.append("mine")
        headers = [(b"content-length", b"2")]
        await theirs.send({"type": "http.response.start", "status": 200, "headers": headers})
        await theirs.send({"type": "http.response.body", "body": b"ok"})
        assert await DoorRequest(mine).answer(200, headers, b"ok")
        assert fields(theirs) == fields(mine)
        assert fields(mine)["response_complete"] and fields(mine)["keep_alive"] is not close
        assert completed == ["theirs", "mine"]
        assert theirs_transport.closed is mine_transport.closed is close
        assert b"".join(theirs_transport.writes) == b"".join(mine_transport.writes)

    asyncio.run(run())


def test_uvicorns_chunked_send_frames_a_piece_as_the_door_writes_it() -> None:
    async def run() -> None:
        transport = Recording()
        cycle = cycle_for(POST + b"{}{}", transport)
        door = DoorRequest(cycle)
        await cycle.send({"type": "http.response.start", "status": 200, "headers": []})
        assert cycle.chunked_encoding is True and door.writable
        await cycle.send({"type": "http.response.body", "body": b"piece", "more_body": True})
        assert door.write(b"piece")
        assert transport.writes[-2] == transport.writes[-1] == b"5\r\npiece\r\n"

    asyncio.run(run())


def test_a_lost_connection_marks_the_unfinished_cycle_disconnected_and_wakes_it() -> None:
    async def run() -> None:
        protocol = uvicorns()
        protocol.data_received(POST + b"{}")  # two of four bytes: the body goes on
        cycle = protocol.cycle
        cycle.message_event.clear()
        for task in protocol.tasks:
            task.cancel()
        protocol.connection_lost(None)
        assert cycle.disconnected and cycle.message_event.is_set()
        assert DoorRequest(cycle).gone

    asyncio.run(run())


def test_a_pipelined_request_takes_the_protocols_cycle_and_waits_in_the_pipeline() -> None:
    """The door keeps the cycle a pipelined request took ``cycle`` from, to tell it of a
    lost connection (uvicorn tells only ``cycle``)."""

    async def run() -> None:
        protocol = uvicorns()
        protocol.data_received(POST + b"{}{}")
        first = protocol.cycle
        protocol.data_received(POST + b"{}{}")
        assert protocol.cycle is not first and not first.response_complete
        assert [c for c, _ in protocol.pipeline] == [protocol.cycle]
        for task in protocol.tasks:
            task.cancel()
        protocol.connection_lost(None)
        assert protocol.cycle.disconnected and not first.disconnected

    asyncio.run(run())
