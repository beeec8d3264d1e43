"""Decoding a backend's whole JSON answer for the request's record.

:meth:`~slm_server.router.call.exchange.Exchange.note_response` reads only strings and
integers (ids, model, finish reasons, token counts), while an embeddings answer is
mostly floats, and making a float object of each is most of what decoding it costs
(about 2 ms of CPU for eight 768-dimension embeddings). So for the record, floats are
left as their text: about three times cheaper, and the same for every field it reads.
"""

from __future__ import annotations

import json
from typing import Any, Final

_FLOATS_AS_TEXT: Final = json.JSONDecoder(parse_float=str)


def answer_fields(content: bytes) -> dict[str, Any] | None:
    """The answer as a JSON object with its floats as text; None when it is not one."""
    try:
        text = content.decode(json.detect_encoding(content), "surrogatepass")
        found = _FLOATS_AS_TEXT.decode(text)
    except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError included
        return None
    return found if isinstance(found, dict) else None
