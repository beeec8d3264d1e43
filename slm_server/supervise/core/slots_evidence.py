"""llama-server's ``GET /slots``, read and compared between two samples. Pure.

At the pinned llama.cpp (``tools/server/server-context.cpp``, ``server_slot::to_json``)
the endpoint is on by default (``--no-slots`` or ``LLAMA_ARG_ENDPOINT_SLOTS=0`` turn it
off; it then answers 501) and returns one object per slot::

    [{"id": 0, "n_ctx": 4096, "speculative": false, "is_processing": true,
      "id_task": 12, "n_prompt_tokens": 30, "n_prompt_tokens_processed": 30,
      "n_prompt_tokens_cache": 0, "params": {...},
      "next_token": [{"has_next_token": true, "has_new_line": false,
                      "n_remain": -1, "n_decoded": 7}]}, ...]

``id_task`` and the rest appear once the slot has had a task. The server's main loop
answers ``/slots`` between two decode batches, and only the main loop changes these
fields: any change between two samples is progress.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from slm_server.supervise.core.confirm import Slots


@dataclass(frozen=True)
class SlotSample:
    """One slot at one moment: whether it is busy, and how far its task has got."""

    id: int
    processing: bool
    task: int | None = None
    decoded: int | None = None
    prompt_processed: int | None = None

    @property
    def progress(self) -> tuple[bool, int | None, int | None, int | None]:
        return (self.processing, self.task, self.decoded, self.prompt_processed)


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def parse_slots(body: bytes) -> tuple[SlotSample, ...]:
    """The slots in a ``/slots`` answer; ValueError when it is not that shape."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"/slots is not JSON: {exc}") from None
    if not isinstance(data, list):
        raise ValueError("/slots is not a JSON array")
    samples = []
    for item in data:
        if not isinstance(item, dict):
            raise ValueError("a /slots entry is not an object")
        slot_id, processing = _int(item.get("id")), item.get("is_processing")
        if slot_id is None or not isinstance(processing, bool):
            raise ValueError("a /slots entry has no integer id or boolean is_processing")
        decoded = None
        next_token = item.get("next_token")
        if isinstance(next_token, list) and next_token and isinstance(next_token[0], dict):
            decoded = _int(next_token[0].get("n_decoded"))
        samples.append(
            SlotSample(
                id=slot_id,
                processing=processing,
                task=_int(item.get("id_task")),
                decoded=decoded,
                prompt_processed=_int(item.get("n_prompt_tokens_processed")),
            )
        )
    return tuple(samples)


def summarize(first: tuple[SlotSample, ...], second: tuple[SlotSample, ...] | None) -> Slots:
    """The two samples as :class:`Slots`; ``second`` is None when it could not be
    taken. A slot that appears in only one sample counts as a change."""
    busy = sum(1 for slot in first if slot.processing)
    if second is None:
        return Slots(total=len(first), busy=busy)
    before = {slot.id: slot.progress for slot in first}
    after = {slot.id: slot.progress for slot in second}
    return Slots(
        total=len(first),
        busy=busy,
        busy_after=sum(1 for slot in second if slot.processing),
        progressed=before != after,
    )
