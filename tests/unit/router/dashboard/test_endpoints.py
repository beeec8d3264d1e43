"""The dashboard in-process: the page and its assets, the watchdog event stream (recent
lines, appended ones, a replaced or truncated file, a hostile line, a client leaving,
the cap on streams, keys), the recent-requests ring and the log tail."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import pytest

from slm_server.router.dashboard import endpoints as dashboard
from slm_server.router.observe import recent
from slm_server.settings import PROJECT_ROOT
from tests.unit.router.inprocess import (
    Answer,
    Router,
    Sent,
    call,
    make_router,
    serving,
    sse,
    until,
    whole,
)

CHAT = "/v1/chat/completions"
MODEL = "org/chat-model"
EVENTS = "/v1/ui/events"
ANSWER = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": MODEL,
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
}


async def answer(_sent: Sent) -> Any:
    return whole(ANSWER)


def router_at(tmp_path: Path, **env: str) -> Router:
    return make_router(tmp_path, answer, env=env)


def run(scenario: Awaitable[None]) -> None:
    asyncio.run(asyncio.wait_for(scenario, 20))


def event_line(n: int, **fields: Any) -> bytes:
    record = {"ts": f"2026-12-01T00:00:{n:02d}.000Z", "event": "backend_exited", "n": n}
    return (json.dumps({**record, **fields}) + "\n").encode()


def append(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("ab") as handle:
        handle.write(data)


class Stream:
    """One open event stream, its events parsed as they arrive."""

    def __init__(self, router: Router, query: str = "", headers: dict[str, str] | None = None):
        self.answer = Answer()
        self.leave = asyncio.Event()
        self.task = asyncio.ensure_future(
            call(
                router.app,
                EVENTS + query,
                b"",
                method="GET",
                headers=headers,
                leave=self.leave,
                answer=self.answer,
            )
        )

    def events(self) -> list[dict[str, Any]]:
        return [e for e in self.answer.events() if isinstance(e, dict)]

    def numbers(self) -> list[int]:
        return [e["n"] for e in self.events() if "n" in e]

    async def close(self) -> Answer:
        self.leave.set()
        return await asyncio.wait_for(self.task, 5)


# -- the page -------------------------------------------------------------------------


@pytest.mark.usefixtures("via")  # through plain ASGI and through the door
def test_the_page_and_its_assets_are_served_from_the_package_without_a_key(
    tmp_path: Path,
) -> None:
    router = router_at(tmp_path, SLM_API_KEYS="secret")

    async def scenario() -> None:
        page = await call(router.app, "/ui", b"", method="GET")
        assert page.status == 200
        assert page.headers["content-type"].startswith("text/html")
        assert "default-src 'none'" in page.headers["content-security-policy"]
        html = page.body.decode()
        assert '<script src="/ui/app.js"' in html and "/ui/style.css" in html
        assert "http://" not in html and "https://" not in html  # nothing from elsewhere
        scripts = [name for name in dashboard.ASSETS if name.endswith(".js")]
        assert "app.js" in scripts
        for name in scripts:  # each is loaded by the page
            assert f'<script src="/ui/{name}"' in html, name
        for asset, kind in dashboard.ASSETS.items():
            if asset == "index.html":
                continue
            got = await call(router.app, f"/ui/{asset}", b"", method="GET")
            assert got.status == 200 and got.headers["content-type"] == kind
            for markup in (b"innerHTML", b"outerHTML", b"insertAdjacentHTML", b"document.write"):
                assert markup not in got.body  # every node is built with textContent
        missing = await call(router.app, "/ui/../../etc/passwd", b"", method="GET")
        assert missing.status == 404

    run(scenario())


def test_the_api_reference_names_every_file_the_page_is_served_as() -> None:
    """Any other ``/ui/...`` name is 404, so the reference lists them all."""
    text = (PROJECT_ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    section = text.split("## Dashboard endpoints", 1)[1].split("\n## ", 1)[0]
    for asset in dashboard.ASSETS:
        assert f"`{asset}`" in section or f"`/ui/{asset}`" in section, asset


@pytest.mark.usefixtures("via")  # through plain ASGI and through the door
def test_every_dashboard_endpoint_needs_the_key_when_keys_are_set(tmp_path: Path) -> None:
    router = router_at(tmp_path, SLM_API_KEYS="secret")

    async def scenario() -> None:
        for path in (EVENTS, "/v1/ui/requests", "/v1/ui/logs/chat"):
            refused = await call(router.app, path, b"", method="GET")
            assert refused.status == 401, path
        good = {"authorization": "Bearer secret"}
        got = await call(router.app, "/v1/ui/requests", b"", method="GET", headers=good)
        assert got.status == 200
        stream = Stream(router, headers=good)
        await until(lambda: stream.answer.status == 200, "the stream to open with the key")
        await stream.close()

    run(scenario())


# -- the event stream -----------------------------------------------------------------


@pytest.mark.usefixtures("via")  # through plain ASGI and through the door
def test_the_stream_sends_recent_lines_then_appended_ones(tmp_path: Path) -> None:
    router = router_at(tmp_path)
    log = router.settings.watchdog.log_path
    append(log, b"".join(event_line(n) for n in range(10)) + b"not json\n")

    async def scenario() -> None:
        async with serving(router):
            stream = Stream(router, "?recent=3")
            await until(lambda: len(stream.events()) == 3, "the recent lines")
            assert stream.numbers() == [8, 9]
            assert stream.events()[-1] == {"unparsed": "not json"}
            append(log, event_line(10, model_id="org/<b>chat</b>"))
            append(log, event_line(11)[:20])  # half a line: not sent until it ends
            await until(lambda: 10 in stream.numbers(), "an appended line")
            assert stream.events()[-1]["model_id"] == "org/<b>chat</b>"
            append(log, event_line(11)[20:])
            await until(lambda: 11 in stream.numbers(), "the line once complete")
            assert stream.answer.headers["content-type"].startswith("text/event-stream")
            await stream.close()

    run(scenario())


@pytest.mark.usefixtures("via")  # through plain ASGI and through the door
def test_the_stream_follows_a_replaced_and_a_truncated_file(tmp_path: Path) -> None:
    router = router_at(tmp_path)
    log = router.settings.watchdog.log_path
    append(log, event_line(1) + event_line(2))

    async def scenario() -> None:
        async with serving(router):
            stream = Stream(router)
            await until(lambda: stream.numbers() == [1, 2], "the recent lines")
            log.replace(log.with_name(log.name + ".prev"))  # rotated: renamed, recreated
            append(log, event_line(3))
            await until(lambda: stream.numbers() == [1, 2, 3], "a line of the new file")
            append(log, event_line(4) + event_line(5))
            await until(lambda: stream.numbers()[-1] == 5, "more lines")
            with log.open("r+b") as handle:  # trimmed: copied away, truncated in place
                handle.truncate(0)
            append(log, event_line(6))
            await until(lambda: stream.numbers()[-1] == 6, "a line after the truncation")
            assert stream.numbers() == [1, 2, 3, 4, 5, 6]
            await stream.close()

    run(scenario())


@pytest.mark.usefixtures("via")  # through plain ASGI and through the door
def test_a_hostile_ten_megabyte_line_is_cut_and_the_stream_goes_on(tmp_path: Path) -> None:
    router = router_at(tmp_path)
    log = router.settings.watchdog.log_path
    append(log, event_line(1))

    async def scenario() -> None:
        async with serving(router):
            stream = Stream(router)
            await until(lambda: stream.numbers() == [1], "the recent line")
            append(log, b'{"event":"' + b"x" * (10 * 1024 * 1024) + b'"}\n' + event_line(2))
            await until(lambda: 2 in stream.numbers(), "the line after the hostile one", 15)
            [cut] = [e for e in stream.events() if e.get("cut")]
            assert len(cut["unparsed"]) == 8 * 1024
            assert len(stream.answer.body) < 64 * 1024
            await stream.close()
        # A stream opened after it starts within the last lines' window, cut there too.
        late = Stream(router)
        await until(lambda: 2 in late.numbers(), "the recent lines after the hostile one")
        assert len(late.answer.body) < 64 * 1024
        await late.close()

    run(scenario())


@pytest.mark.usefixtures("via")  # through plain ASGI and through the door
def test_a_client_leaving_ends_its_stream_and_streams_are_capped(tmp_path: Path) -> None:
    router = router_at(tmp_path)
    append(router.settings.watchdog.log_path, event_line(1))

    async def scenario() -> None:
        streams = [Stream(router) for _ in range(dashboard.MAX_STREAMS)]
        await until(lambda: all(s.numbers() == [1] for s in streams), "every stream open")
        extra = await call(router.app, EVENTS, b"", method="GET")
        assert extra.status == 429
        assert extra.json()["error"]["code"] == "too_many_streams"
        for stream in streams:
            ended = await stream.close()  # the app's call returns: the stream has ended
            assert ended.status == 200
        again = Stream(router)
        await until(lambda: again.numbers() == [1], "a stream once the others left")
        await again.close()

    run(scenario())


@pytest.mark.usefixtures("via")  # through plain ASGI and through the door
def test_a_bad_count_is_refused(tmp_path: Path) -> None:
    router = router_at(tmp_path)

    async def scenario() -> None:
        for query in ("?recent=-1", "?recent=abc", "?recent=99999999999"):
            got = await call(router.app, EVENTS + query, b"", method="GET")
            assert got.status == 400, query
            assert got.json()["error"]["param"] == "recent"

    run(scenario())


@pytest.mark.usefixtures("via")  # through plain ASGI and through the door
def test_a_missing_log_streams_nothing_until_it_appears(tmp_path: Path) -> None:
    router = router_at(tmp_path)
    log = router.settings.watchdog.log_path

    async def scenario() -> None:
        stream = Stream(router)
        await until(lambda: stream.answer.status == 200, "the stream to open")
        assert stream.events() == []
        append(log, event_line(7))
        await until(lambda: stream.numbers() == [7], "the first line of a new file")
        await stream.close()

    run(scenario())


# -- recent requests ------------------------------------------------------------------


@pytest.mark.usefixtures("via")  # through plain ASGI and through the door
def test_recent_requests_are_kept_newest_first_and_bounded(tmp_path: Path) -> None:
    router = router_at(tmp_path)
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}

    async def scenario() -> None:
        async with serving(router):
            for _ in range(recent.CAPACITY + 5):
                assert (await call(router.app, CHAT, chat)).status == 200
            unknown = {**chat, "model": "x" * 10_000}
            assert (await call(router.app, CHAT, unknown)).status == 404
            await call(router.app, "/health", b"", method="GET")  # not a model request
            got = await call(router.app, "/v1/ui/requests", b"", method="GET")
            rows = got.json()["data"]
            assert len(rows) == recent.CAPACITY
            assert rows[0]["status"] == 404 and len(rows[0]["model"]) == 256
            first = rows[1]
            assert first["model"] == MODEL and first["endpoint"] == CHAT
            assert first["status"] == 200
            assert (first["input_tokens"], first["output_tokens"]) == (3, 2)
            assert first["duration_seconds"] >= 0 and first["queue_seconds"] is not None
            assert rows[1]["time"] >= rows[-1]["time"]

    run(scenario())


@pytest.mark.usefixtures("via")  # through plain ASGI and through the door
def test_a_recent_request_names_the_alias_it_was_sent_by(tmp_path: Path) -> None:
    router = make_router(tmp_path, answer, chat="    aliases: [gpt-4o-mini]\n")
    hi = [{"role": "user", "content": "hi"}]

    async def scenario() -> None:
        async with serving(router):
            for model in ("gpt-4o-mini", MODEL):
                body = {"model": model, "messages": hi}
                assert (await call(router.app, CHAT, body)).status == 200
            unknown = {"model": "gpt-5", "messages": hi}
            assert (await call(router.app, CHAT, unknown)).status == 404
            got = await call(router.app, "/v1/ui/requests", b"", method="GET")
            rows = got.json()["data"]
            shown = [(r["model"], r["alias"], r["status"]) for r in rows]
            assert shown == [("gpt-5", None, 404), (MODEL, None, 200), (MODEL, "gpt-4o-mini", 200)]

    run(scenario())


@pytest.mark.usefixtures("via")  # through plain ASGI and through the door
def test_a_recent_request_carries_its_detail(tmp_path: Path) -> None:
    """What the request's detail shows: the stages' times, the backend, the preset
    layers, the cached tokens and why an error was answered."""
    chunk = {**ANSWER, "object": "chat.completion.chunk", "usage": None}
    usage = {
        "prompt_tokens": 3,
        "completion_tokens": 2,
        "prompt_tokens_details": {"cached_tokens": 2},
    }

    async def streamed(sent: Sent) -> Any:
        if sent.json().get("stream"):
            return sse(chunk, chunk, {**chunk, "choices": [], "usage": usage})
        return whole({**ANSWER, "usage": usage})

    precise = "    preset: {max_output_tokens: 64}\n    aliases:\n      - name: precise\n"
    router = make_router(tmp_path, streamed, chat=precise + "        preset: {set: {top_p: 0.5}}\n")
    hi = [{"role": "user", "content": "hi"}]

    async def scenario() -> None:
        async with serving(router):
            body = {"model": "precise", "messages": hi, "stream": True}
            assert (await call(router.app, CHAT, body)).status == 200
            assert (await call(router.app, CHAT, {"model": MODEL, "messages": hi})).status == 200
            image = [{"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}}]
            bad = {"model": MODEL, "messages": [{"role": "user", "content": image}]}
            assert (await call(router.app, CHAT, bad)).status == 400
            got = await call(router.app, "/v1/ui/requests", b"", method="GET")
            refused, plain, aliased = got.json()["data"]
            assert aliased["alias"] == "precise"
            assert aliased["preset"] == ["entry", "alias precise"]
            assert aliased["backend"] == router.spec.role and aliased["cached_tokens"] == 2
            assert aliased["first_byte_seconds"] == aliased["ttft_seconds"] is not None
            assert aliased["streamed_seconds"] is not None and aliased["load_seconds"] is None
            assert aliased["error_message"] is None and aliased["outcome"] == "ok"
            assert plain["preset"] == ["entry"] and plain["streamed_seconds"] is None
            assert refused["status"] == 400 and "image" in refused["error_message"]
            assert refused["outcome"] == "client_error"

    run(scenario())


def test_a_request_whose_load_failed_shows_how_long_it_waited_for_it(tmp_path: Path) -> None:
    """The load wait is the request's time even when the load fails: the detail would
    otherwise show all of it as the wait for the backend's first byte."""
    router = make_router(tmp_path, answer, chat="    load: on_demand\n")
    router.supervisor.load_seconds = 0.2
    router.supervisor.fail_load = "exited with status 1 while loading"

    async def scenario() -> None:
        async with serving(router):
            body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
            assert (await call(router.app, CHAT, body)).status == 503
            got = await call(router.app, "/v1/ui/requests", b"", method="GET")
            [failed] = got.json()["data"]
            assert failed["error_type"] == "load_failed"
            assert failed["load_seconds"] is not None
            assert 0.2 <= failed["load_seconds"] <= failed["duration_seconds"]

    run(scenario())


# -- a backend's log ------------------------------------------------------------------


def published_log(router: Router, path: Path) -> None:
    from tests.unit.router.inprocess import backend_state

    spec = router.spec
    router.states.states[(spec.role, spec.entry.port)] = backend_state(
        spec, "ready", log_path=str(path)
    )


def test_the_log_tail_is_bounded_and_only_for_known_roles(tmp_path: Path) -> None:
    router = router_at(tmp_path)
    log = router.settings.log_dir / "llama-chat.log"
    append(log, b"".join(b"line %d\n" % n for n in range(5000)) + b"y" * 100_000 + b"\n")
    published_log(router, log)

    async def scenario() -> None:
        got = await call(router.app, "/v1/ui/logs/chat?lines=3", b"", method="GET")
        assert got.status == 200
        body = got.json()
        assert body["model_id"] == MODEL
        assert body["lines"][:2] == ["line 4998", "line 4999"]
        assert len(body["lines"][2]) == 8 * 1024 and body["cut"] == 1
        most = await call(router.app, "/v1/ui/logs/chat?lines=99999", b"", method="GET")
        assert len(most.json()["lines"]) <= dashboard.MAX_LOG_LINES
        assert len(most.body) < 300 * 1024
        for role in ("nope", "..", "chat%2F..%2F..%2Fetc"):
            refused = await call(router.app, f"/v1/ui/logs/{role}", b"", method="GET")
            assert refused.status == 404, role
            assert refused.json()["error"]["code"] == "model_not_found"

    run(scenario())


@pytest.mark.usefixtures("via")  # through plain ASGI and through the door
def test_a_published_log_outside_the_log_directory_is_not_read(tmp_path: Path) -> None:
    router = router_at(tmp_path)
    outside = tmp_path / "secret.txt"
    outside.write_text("do not show\n")
    published_log(router, outside)
    os.makedirs(router.settings.log_dir, exist_ok=True)
    (router.settings.log_dir / "link.log").symlink_to(outside)

    async def scenario() -> None:
        for path in (outside, router.settings.log_dir / "link.log"):
            published_log(router, path)
            got = await call(router.app, "/v1/ui/logs/chat", b"", method="GET")
            assert got.status == 200
            assert got.json()["lines"] == [] and got.json()["log_path"] is None

    run(scenario())


def test_the_follower_says_unchanged_without_reading_only_when_nothing_was_appended(
    tmp_path: Path,
) -> None:
    from slm_server.router.dashboard.log_tail import Follower

    log = tmp_path / "watchdog.jsonl"
    log.write_text('{"event": "a"}\n')
    follower = Follower(log)
    follower.start(10)
    assert follower.unchanged()
    with log.open("a") as handle:
        handle.write('{"event": "b"}\n')
    assert not follower.unchanged()
    assert [line.text for line in follower.poll()] == ['{"event": "b"}']
    assert follower.unchanged()
    replaced = tmp_path / "new.jsonl"
    replaced.write_text('{"event": "c"}\n')
    replaced.replace(log)  # same size, another file
    assert not follower.unchanged()
    log.unlink()
    assert follower.unchanged()  # gone for now: nothing to read
