"""An infill request checked, and a completions request with ``suffix`` translated to
one. Pure.

llama-server's ``/infill`` (``post_infill`` at the pinned commit) answers a missing
``input_prefix`` or ``input_suffix``, and an ``input_extra`` chunk that is not an
object, with a 500 (it notes the error and reads on, and the read throws): the router
refuses them first, with a 400 naming the field, so that a client's mistake never
counts against the backend. ``input_prefix`` and ``input_suffix`` are text or a list of
token ids and texts (its ``tokenize_mixed``), ``prompt`` text appended to the prefix,
``input_extra`` a list of ``{"filename", "text"}`` (more fields are left alone:
llama.vscode sends ``time``).

A completions request's ``prompt`` becomes ``input_prefix`` and its ``suffix``
``input_suffix``; every other field goes as it is (llama-server reads ``max_tokens``,
``stop``, ``temperature``... on ``/infill`` as on completions). What the answer could
not carry back in OpenAI's shape is refused: several prompts or choices, ``echo``,
``best_of``, ``logprobs``.
"""

from __future__ import annotations

from typing import Any

from slm_server.errors import InvalidRequest

# Completions fields the infill answer cannot carry back, and what they may be.
_REFUSED = (("n", (None, 1)), ("best_of", (None, 1)), ("echo", (None, False)))


def _invalid(message: str, param: str) -> InvalidRequest:
    return InvalidRequest(message, code="invalid_infill", param=param)


def _mixed(value: Any) -> bool:
    """Text, or a list of token ids and texts (llama-server's ``tokenize_mixed``)."""
    if isinstance(value, str):
        return True
    return isinstance(value, list) and all(
        isinstance(item, str) or (isinstance(item, int) and not isinstance(item, bool))
        for item in value
    )


def check_infill(payload: dict[str, Any], _model_type: str) -> None:
    """Refuse an ``/infill`` body llama-server would answer 500 (see the module)."""
    for name in ("input_prefix", "input_suffix"):
        if name not in payload:
            raise _invalid(f"'{name}' is required (text; empty is allowed)", name)
        if not _mixed(payload[name]):
            raise _invalid(f"'{name}' must be text or a list of token ids and texts", name)
    prompt = payload.get("prompt")
    if prompt is not None and not isinstance(prompt, str):
        raise _invalid("'prompt' must be text (it is put after input_prefix)", "prompt")
    extra = payload.get("input_extra")
    if extra is None:
        return
    if not isinstance(extra, list):
        raise _invalid("'input_extra' must be a list of {filename, text}", "input_extra")
    for index, chunk in enumerate(extra):
        where = f"input_extra[{index}]"
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text"), str):
            raise _invalid(f"'{where}' must be an object with a text 'text'", where)
        if "filename" in chunk and not isinstance(chunk["filename"], str):
            raise _invalid(f"'{where}.filename' must be text", where)


def _prefix(prompt: Any) -> str | list[Any]:
    """A completions ``prompt`` as one ``input_prefix``: text, or one list of ids."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(
        isinstance(item, int) and not isinstance(item, bool) for item in prompt
    ):
        return prompt  # one prompt of token ids
    raise _invalid(
        "With 'suffix', 'prompt' must be one prompt: text, or one list of token ids",
        "prompt",
    )


def check_suffix(payload: dict[str, Any]) -> None:
    """Refuse a completions request with ``suffix`` whose answer the infill answer
    cannot make (see the module)."""
    if not isinstance(payload.get("suffix"), str):
        raise _invalid("'suffix' must be text", "suffix")
    _prefix(payload.get("prompt"))
    for name, allowed in _REFUSED:
        if payload.get(name) not in allowed:
            raise _invalid(f"'{name}' is not served with 'suffix' (one choice, no echo)", name)
    if payload.get("logprobs") not in (None, 0, False):
        raise _invalid("'logprobs' is not served with 'suffix'", "logprobs")


def to_infill(payload: dict[str, Any]) -> dict[str, Any]:
    """The ``/infill`` request for a completions request with ``suffix`` (checked by
    :func:`check_suffix`): its prompt the prefix, its suffix the suffix."""
    body = {
        name: value
        for name, value in payload.items()
        if name not in ("prompt", "suffix", "echo", "best_of", "n", "logprobs")
    }
    body["input_prefix"] = _prefix(payload.get("prompt"))
    body["input_suffix"] = payload["suffix"]
    body["prompt"] = ""
    return body


__all__ = ["check_infill", "check_suffix", "to_infill"]
