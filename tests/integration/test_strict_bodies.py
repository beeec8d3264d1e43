"""Nothing a client sends can count against a backend: JSON that llama-server's parser
refuses (it answers 500, and two 500s in a row are a watchdog trip) is refused by the
router with 400 before admission, and never reaches the backend. Real processes: the
launcher supervising a fake llama-server, the real router in front."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from slm_server.contracts.restart_requests import RestartRequest, write_request
from tests import one_shot
from tests.fakes.control import FakeBackend
from tests.integration.watched import Watched, fake_entry, watched
from tests.processes import poll

MODEL = "fake-standard"
HELLO = '[{"role": "user", "content": "hello"}]'


def chat(extra: str, messages: str = HELLO) -> bytes:
    return f'{{"model": "{MODEL}", "messages": {messages}, {extra}}}'.encode()


# Bodies Python's json.loads accepts (the router used to forward them) and llama-server's
# nlohmann::json refuses.
GARBAGE = {
    "nan": chat('"temperature": NaN'),
    "infinity": chat('"temperature": Infinity'),
    "minus-infinity": chat('"top_p": -Infinity'),
    "float-overflow": chat('"temperature": 1e999'),  # Python: inf, re-sent as Infinity
    "int-overflow": chat('"max_tokens": ' + "9" * 400),
    "int-too-long-for-python": chat('"seed": ' + "1" * 5000),
    "lone-high-surrogate": chat('"n": 1', '[{"role": "user", "content": "hi \\ud83d"}]'),
    "lone-low-surrogate": chat('"n": 1', '[{"role": "user", "content": "\\ude00"}]'),
    "lone-surrogate-key": chat('"metadata": {"\\udbff": 1}'),
    # The bytes ED A0 80: U+D800 encoded as UTF-8 (Python reads them with surrogatepass).
    "utf8-encoded-surrogate": chat('"stop": "x"').replace(b'"x"', b'"\xed\xa0\x80"'),
    "utf16": chat('"n": 1').decode().encode("utf-16"),
    "utf16-le-no-bom": chat('"n": 1').decode().encode("utf-16-le"),
    "utf32": chat('"n": 1').decode().encode("utf-32"),
    "deep-nesting": chat('"stop": ' + "[" * 100_000 + "]" * 100_000),
}
CONTENT_TYPES = ("application/json", "text/plain")
REFUSED = {"application/json": (400, "invalid_json"), "text/plain": (415, "unsupported_media_type")}
PAIRS = 2


def fake_requests(stack: Watched) -> list[dict[str, object]]:
    url = f"http://127.0.0.1:{stack.port('standard')}/_requests"
    records: list[dict[str, object]] = one_shot.get(url, timeout=5).json()
    return records


def a_sweep_has_passed(stack: Watched) -> None:
    """Wait until the supervisor has swept after everything so far (it consumes a
    request file for nobody at its next sweep)."""
    marker = write_request(
        stack.log_dir / "watchdog-requests",
        RestartRequest("nobody", "none", 1, "marker", time.time()),
    )
    poll(lambda: not marker.exists(), 5, "a supervisor sweep")


@pytest.mark.parametrize("name", sorted(GARBAGE))
def test_the_fake_answers_garbage_as_llama_server_does(name: str) -> None:
    # What the router must never forward: each of these is a 500 from llama-server.
    with FakeBackend.start(model_id=MODEL) as fake:
        response = one_shot.post(
            f"{fake.url}/v1/chat/completions", content=GARBAGE[name], timeout=10
        )
        assert response.status_code == 500
        error = response.json()["error"]
        assert error["type"] == "server_error"
        assert error["code"] == 500
        assert error["message"].startswith("[json.exception.parse_error.101] parse error")


def test_client_garbage_is_refused_and_never_counts_against_the_backend(tmp_path: Path) -> None:
    models = {"standard": fake_entry(tmp_path, "standard")}
    with watched(tmp_path, models) as stack:
        pid = stack.pid("standard")
        started = stack.state("standard")["started_at"]
        poll(lambda: time.time() > started + 0.6, 5, "the startup grace to pass")
        with httpx.Client(base_url=stack.url, timeout=10) as client:
            for name, body in GARBAGE.items():
                for path in ("/v1/chat/completions", "/v1/completions"):
                    for content_type in CONTENT_TYPES:
                        for _ in range(PAIRS):
                            response = client.post(
                                path, content=body, headers={"content-type": content_type}
                            )
                            # A browser page may send text/plain cross-site: refused for
                            # its type before the body is read.
                            expected = REFUSED[content_type]
                            assert response.status_code == expected[0], (name, response.text[:300])
                            error = response.json()["error"]
                            assert error["type"] == "invalid_request_error", name
                            assert error["code"] == expected[1], name
            a_sweep_has_passed(stack)
            assert fake_requests(stack) == [], "a refused body reached the backend"
            assert not stack.events("backend_failure")
            assert not stack.events("restart_requested")
            assert not stack.events("restart_started")
            assert stack.pid("standard") == pid
            assert stack.state("standard")["state"] == "ready"

            valid = json.dumps({"model": MODEL, "messages": json.loads(HELLO)}).encode()
            response = client.post(
                "/v1/chat/completions", content=valid, headers={"content-type": "application/json"}
            )
            assert response.status_code == 200
            [record] = fake_requests(stack)
            # As sent, but streamed from llama-server to be gathered whole.
            gathered = {"stream": True, "stream_options": {"include_usage": True}}
            gathered["return_progress"] = True
            assert record["body"] == {**json.loads(valid), **gathered}


def test_valid_edge_cases_still_reach_the_backend(tmp_path: Path) -> None:
    models = {"standard": fake_entry(tmp_path, "standard")}
    bodies = [
        # An emoji as a surrogate pair, floats near the limit, negative zero, a big int.
        chat(
            f'"temperature": 1.7e308, "top_p": -0.0, "seed": {2**64}',
            '[{"role": "user", "content": "\\ud83d\\ude00 and caf\\u00e9 \\u65e5"}]',
        ),
        b"\xef\xbb\xbf" + chat('"n": 1'),  # a UTF-8 BOM: nlohmann::json skips it
        chat('"stop": ' + "[" * 100 + "]" * 100),
    ]
    with watched(tmp_path, models) as stack, httpx.Client(base_url=stack.url, timeout=10) as client:
        for body in bodies:
            response = client.post(
                "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
            )
            assert response.status_code == 200, response.text[:300]
        records = fake_requests(stack)
        assert len(records) == len(bodies)
        first: Any = records[0]["body"]
        assert first["messages"][0]["content"] == "\U0001f600 and caf\u00e9 \u65e5"
        assert first["seed"] == 2**64
        assert not stack.events("backend_failure")
