"""``POST /api/chat``, ``/api/generate``, ``/api/embed`` and ``/api/embeddings``:
Ollama's requests translated (:mod:`.to_chat`) and sent to the backend's chat
completions (a raw ``generate``: completions; the embeddings: ``/v1/embeddings``), the
answers translated back (:mod:`.answers`): one JSON object, or, as Ollama streams by
default, JSON lines. Every kind of backend is served, as for the Messages API.

``keep_alive`` is the idle TTL of an on-demand model (:meth:`Loader.keep_alive`),
set for its process once the request is admitted; a model kept loaded for good
(``load: always``) takes no ``keep_alive: 0``, which would unload it. A request that
asks nothing (``generate`` with no prompt, ``chat`` with no messages, ``embed`` with no
input) loads the model, as Ollama's does; with ``keep_alive: 0`` it unloads it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp

from slm_server.contracts import engine_paths
from slm_server.errors import BackendProtocolError, GatewayError, InvalidRequest, ModelConflict
from slm_server.registry.schema import ModelSpec
from slm_server.router.answer.relay import Relay
from slm_server.router.answer.translation import (
    ChatTranslation,
    WholeOnly,
    backend_message,
    error_message,
)
from slm_server.router.apis.infill.endpoint import FILLS_IN_ITSELF, refuse, refuse_known
from slm_server.router.apis.ollama.answers import (
    Clock,
    Kind,
    OllamaLines,
    final_fields,
    now_stamp,
    whole_answer,
)
from slm_server.router.apis.ollama.model_facts import ModelFacts
from slm_server.router.apis.ollama.options import keep_alive_seconds
from slm_server.router.apis.ollama.to_chat import Translated, chat_request, generate_request
from slm_server.router.call.admitted_call import Call
from slm_server.router.call.shape import Shape
from slm_server.router.intake.payload import apply_defaults, gather_stream
from slm_server.router.intake.presets import SHAPES, apply_preset, cap_binds, resolve
from slm_server.router.intake.reception import Intake
from slm_server.router.intake.strict_json import dumps_body
from slm_server.router.intake.tool_calls import check_tool_calls

API = "Ollama's API"
NDJSON = "application/x-ndjson"
# The header naming the options the gateway left alone (the registry sets them).
IGNORED_HEADER = "x-slm-ignored-options"

# The one place the models' file facts are read and kept (shared with the catalog).
FACTS = ModelFacts()


def _dumps(body: dict[str, Any]) -> bytes:
    return json.dumps(body, ensure_ascii=False).encode()


def ollama_error(status: int, content: bytes) -> bytes:
    """A backend's error answer (any shape) as Ollama's ``{"error": "..."}``."""
    return _dumps({"error": backend_message(status, content)})


class OllamaTranslation(ChatTranslation[OllamaLines]):
    """Ollama's answer to one request, from chat (or text) completions."""

    api = API
    media_type = NDJSON
    splices = True

    def __init__(
        self, request: dict[str, Any], kind: Kind, clock: Clock, *, capped: bool = False
    ) -> None:
        model = request.get("model")
        self.model = model if isinstance(model, str) else ""
        self.kind, self.clock = kind, clock
        super().__init__(request, OllamaLines(kind, self.model, clock), capped=capped)

    def answer(self, chat: dict[str, Any]) -> dict[str, Any]:
        return whole_answer(chat, self.kind, self.model, self.clock)

    def failed(self, error: Any) -> list[bytes]:
        return self.translator.error(error_message(error))

    def error_body(self, status: int, content: bytes) -> bytes:
        return ollama_error(status, content)

    def stream_error(self, error: GatewayError) -> bytes:
        return error.ollama_line()


def ignored_header(names: tuple[str, ...]) -> str:
    """The options left alone, as a header value: each name as JSON writes it in ASCII
    (no byte a header cannot carry), at most 1000 characters."""
    shown = ",".join(json.dumps(name)[1:-1] for name in names)
    return shown[:1000]


def _translated(intake: Intake) -> Translated:
    found = intake.prepared
    if not isinstance(found, Translated):
        raise ValueError("an Ollama request is sent only once prepared")
    return found


def _completions_of(infill: dict[str, Any]) -> dict[str, Any]:
    """An infill request as completions' ``prompt`` and ``suffix``, for the engine that
    fills in the middle on those (llama-cpp-python's server)."""
    body = {k: v for k, v in infill.items() if k not in ("input_prefix", "input_suffix")}
    body["prompt"], body["suffix"] = infill["input_prefix"], infill["input_suffix"]
    if "n_predict" in body:
        body["max_tokens"] = body.pop("n_predict")
    return body


def keep_alive_of(spec: ModelSpec, payload: dict[str, Any]) -> float | None:
    """The request's ``keep_alive`` in seconds (None: not given), refused (409) where
    it would unload a model its entry keeps loaded for good."""
    seconds = keep_alive_seconds(payload.get("keep_alive"))
    if seconds == 0 and spec.entry.load != "on_demand":
        raise ModelConflict(
            f"'{spec.entry.id}' is kept loaded for good (load: always in the registry) and "
            "cannot be unloaded: send no keep_alive, or one above 0 (it stays loaded)",
            param="keep_alive",
        )
    return seconds


class _OllamaApi:
    """What the chat and generate endpoints share: the translation, the checks before
    admission, the answer."""

    translate: ClassVar[Callable[..., Translated]]
    chat_kind: ClassVar[bool]

    def __init__(
        self,
        shape: Shape,
        relay: Relay,
        completions: Shape | None = None,
        infill: Shape | None = None,
    ) -> None:
        self.shape = shape
        self.relay = relay
        self.completions = completions  # the shape a raw prompt is sent as
        self.infill = infill  # ... and a prompt with a suffix

    def stream_error(self, intake: Intake, error: GatewayError) -> bytes:
        return error.ollama_line()

    def before_admission(self, intake: Intake) -> Intake | Response:
        spec = intake.spec
        entry = spec.entry
        payload = intake.payload
        keep = keep_alive_of(spec, payload)
        translated = type(self).translate(
            payload,
            takes_images=entry.model_type == "multimodal",
            context_length=entry.context_length,
        )
        if translated.think and not FACTS.of(entry).thinking and entry.reasoning_parser is None:
            raise InvalidRequest(f'"{entry.id}" does not support thinking', param="think")
        body = translated.body
        if translated.kind == "chat":
            check_tool_calls(body)
        if translated.kind == "infill":
            refuse_known(self.relay, spec)  # a model without fill-in-the-middle tokens
        if translated.empty and keep == 0:
            self.relay.keep_alive(spec, 0)  # unloaded once idle, without loading it first
            return JSONResponse(self._empty(payload, "unload"))
        names = SHAPES[translated.kind if translated.kind != "infill" else "completions"]
        rules = resolve(entry, intake.alias)
        capped = cap_binds(body, names, rules)
        body = apply_preset(body, names, rules)
        translated = replace(translated, body=body, keep_alive=keep)
        watch = translated.stream and intake.reports
        return replace(
            intake,
            prepared=translated,
            capped=capped,
            watch_progress=watch,
            hidden_progress=watch,
        )

    def _empty(self, payload: dict[str, Any], reason: str) -> dict[str, Any]:
        model = payload.get("model")
        answer: dict[str, Any] = {"model": model, "created_at": now_stamp()}
        if self.chat_kind:
            answer["message"] = {"role": "assistant", "content": ""}
        else:
            answer["response"] = ""
        answer.update({"done": True, "done_reason": reason})
        return answer

    async def send(self, call: Call, intake: Intake) -> Response | ASGIApp:
        translated = _translated(intake)
        payload = intake.payload
        self.relay.keep_alive(call.spec, translated.keep_alive)
        if translated.empty:  # loaded (the proxy waited for it): nothing to ask
            call.slot.release()
            return JSONResponse(self._empty(payload, "load"))
        kind = translated.kind
        body = {**translated.body, "model": payload.get("model")}
        if kind == "infill":
            await refuse(self.relay, call.spec)
            if self.relay.server_kind(call.spec) == FILLS_IN_ITSELF:
                kind, body = "completions", _completions_of(body)
        shape = self.relay_shape(kind)
        if call.watch_progress:  # the reports are the router's: the translation drops them
            body["return_progress"] = True
        elif gather_stream(body, shape, intake.reports):
            call.gathered = call.watch_progress = True
        apply_defaults(body, shape, self.relay.sampling_defaults(call.spec))
        clock = Clock(call.exchange.started, call.exchange.load_seconds)
        answer_kind = Kind(self.chat_kind, kind == "completions", kind == "infill")
        translation = OllamaTranslation(payload, answer_kind, clock, capped=call.capped)
        if kind == "chat":
            guarded = await self.relay.guarded(
                call, body, intake.alias, intake.reports, translation
            )
            body = guarded or body
        answer = await self.relay.relay(call, shape.path, dumps_body(body), translation)
        if translated.ignored and isinstance(answer, Response):
            answer.headers[IGNORED_HEADER] = ignored_header(translated.ignored)
        return answer

    def relay_shape(self, kind: str) -> Shape:
        """The shape the backend is sent: chat completions, or, for a raw prompt,
        completions, or, for a prompt with a suffix, llama-server's infill."""
        shapes = {"completions": self.completions, "infill": self.infill}
        found = shapes.get(kind, self.shape.translated_to)
        if found is None:
            raise ValueError(f"the {self.shape.name} shape names no shape for {kind}")
        return found


class OllamaChatApi(_OllamaApi):
    """``POST /api/chat``."""

    translate = staticmethod(chat_request)
    chat_kind = True


class OllamaGenerateApi(_OllamaApi):
    """``POST /api/generate``."""

    translate = staticmethod(generate_request)
    chat_kind = False


class EmbedAnswer(WholeOnly):
    """Ollama's embeddings answer from ``/v1/embeddings``: ``/api/embed``'s
    ``embeddings`` (one per input), or the older ``/api/embeddings``' one
    ``embedding``."""

    api = API

    def __init__(self, request: dict[str, Any], clock: Clock, *, legacy: bool) -> None:
        model = request.get("model")
        self.model = model if isinstance(model, str) else ""
        self.clock = clock
        self.legacy = legacy

    async def whole(self, answer: dict[str, Any]) -> dict[str, Any]:
        data = answer.get("data")
        if not isinstance(data, list):
            raise BackendProtocolError("the backend's embeddings answer has no data list")
        items = sorted((d for d in data if isinstance(d, dict)), key=_index)
        vectors = [d.get("embedding") for d in items]
        if not all(isinstance(v, list) for v in vectors):
            raise BackendProtocolError("the backend's embeddings answer has no vectors")
        if self.legacy:
            return {"embedding": vectors[0] if vectors else []}
        timing = final_fields(self.clock, answer.get("usage"), None, "stop")
        return {
            "model": self.model,
            "embeddings": vectors,
            "total_duration": timing["total_duration"],
            "load_duration": timing["load_duration"],
            "prompt_eval_count": timing["prompt_eval_count"],
        }

    def error_body(self, status: int, content: bytes) -> bytes:
        return ollama_error(status, content)

    def stream_error(self, error: GatewayError) -> bytes:  # never a stream
        return error.ollama_line()


@dataclass(frozen=True, slots=True)
class EmbedRequest:
    """An Ollama embeddings request as its backend is sent it, and its ``keep_alive``."""

    body: dict[str, Any]
    keep_alive: float | None


def _index(item: dict[str, Any]) -> int:
    index = item.get("index")
    return index if isinstance(index, int) else 0


def _inputs(payload: dict[str, Any], legacy: bool) -> list[str]:
    name = "prompt" if legacy else "input"
    value = payload.get(name)
    if value is None:
        return []
    if isinstance(value, str):
        return [value] if value or legacy else []
    if legacy or not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        kind = "a string" if legacy else "a string or a list of strings"
        raise InvalidRequest(f"{name} must be {kind}", param=name)
    return list(value)


class OllamaEmbedApi:
    """``POST /api/embed`` (and, ``legacy``, ``/api/embeddings``) over the backend's
    ``/v1/embeddings``."""

    legacy: ClassVar[bool] = False

    def __init__(self, shape: Shape, relay: Relay) -> None:
        self.shape = shape
        self.relay = relay

    def stream_error(self, intake: Intake, error: GatewayError) -> bytes:
        return error.ollama_line()

    def before_admission(self, intake: Intake) -> Intake | Response:
        payload = intake.payload
        keep = keep_alive_of(intake.spec, payload)
        inputs = _inputs(payload, self.legacy)
        truncate = payload.get("truncate")
        if truncate is not None and not isinstance(truncate, bool):
            raise InvalidRequest("truncate must be true or false", param="truncate")
        body: dict[str, Any] = {"model": payload.get("model"), "input": inputs}
        dimensions = payload.get("dimensions")
        if dimensions is not None:
            if isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1:
                raise InvalidRequest("dimensions must be a positive integer", param="dimensions")
            body["dimensions"] = dimensions
        if not inputs and keep == 0:
            self.relay.keep_alive(intake.spec, 0)
            return JSONResponse(self._empty(payload))
        return replace(intake, prepared=EmbedRequest(body, keep))

    def _empty(self, payload: dict[str, Any]) -> dict[str, Any]:
        if self.legacy:
            return {"embedding": []}
        return {"model": payload.get("model"), "embeddings": []}

    async def send(self, call: Call, intake: Intake) -> Response | ASGIApp:
        payload = intake.payload
        prepared = intake.prepared
        if not isinstance(prepared, EmbedRequest):
            raise ValueError("an Ollama embeddings request is sent only once prepared")
        self.relay.keep_alive(call.spec, prepared.keep_alive)
        body = prepared.body
        if not body["input"]:  # loaded (the proxy waited for it): nothing to ask
            call.slot.release()
            return JSONResponse(self._empty(payload))
        clock = Clock(call.exchange.started, call.exchange.load_seconds)
        answer = EmbedAnswer(payload, clock, legacy=self.legacy)
        return await self.relay.relay(call, engine_paths.EMBEDDINGS, _dumps(body), answer)


class OllamaEmbeddingsApi(OllamaEmbedApi):
    """``POST /api/embeddings``: one ``prompt``, one ``embedding``."""

    legacy = True


__all__ = [
    "FACTS",
    "NDJSON",
    "OllamaChatApi",
    "OllamaEmbedApi",
    "OllamaEmbeddingsApi",
    "OllamaGenerateApi",
    "OllamaTranslation",
    "keep_alive_of",
    "ollama_error",
]
