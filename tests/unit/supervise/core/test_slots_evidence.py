"""Reading llama-server's /slots and comparing two samples."""

from __future__ import annotations

import json

import pytest

from slm_server.supervise.core.confirm import Slots
from slm_server.supervise.core.slots_evidence import SlotSample, parse_slots, summarize

# One busy and one idle slot, as the pinned llama-server answers (only_metrics view).
PINNED = [
    {
        "id": 0,
        "n_ctx": 4096,
        "speculative": False,
        "is_processing": True,
        "id_task": 12,
        "n_prompt_tokens": 30,
        "n_prompt_tokens_processed": 30,
        "n_prompt_tokens_cache": 0,
        "params": {"n_predict": -1},
        "next_token": [
            {"has_next_token": True, "has_new_line": False, "n_remain": -1, "n_decoded": 7}
        ],
    },
    {"id": 1, "n_ctx": 4096, "speculative": False, "is_processing": False},
]


def test_parse_the_pinned_shape() -> None:
    assert parse_slots(json.dumps(PINNED).encode()) == (
        SlotSample(id=0, processing=True, task=12, decoded=7, prompt_processed=30),
        SlotSample(id=1, processing=False),
    )


@pytest.mark.parametrize(
    "body",
    [b"", b"nope", b"{}", b"[1]", b'[{"id": 0}]', b'[{"is_processing": true}]', b"\xff"],
)
def test_parse_refuses_other_shapes(body: bytes) -> None:
    with pytest.raises(ValueError, match="/slots"):
        parse_slots(body)


BUSY = SlotSample(id=0, processing=True, task=3, decoded=5, prompt_processed=9)
IDLE = SlotSample(id=1, processing=False)


@pytest.mark.parametrize(
    ("after", "progressed"),
    [
        ((BUSY, IDLE), False),
        ((SlotSample(0, True, 3, 6, 9), IDLE), True),  # a token decoded
        ((SlotSample(0, True, 3, 5, 10), IDLE), True),  # prompt processing
        ((SlotSample(0, True, 4, 0, 0), IDLE), True),  # a new task
        ((SlotSample(0, False, 3, 5, 9), IDLE), True),  # finished
        ((BUSY, SlotSample(1, True, 8, 0, 1)), True),  # an idle slot took a task
        ((BUSY,), True),  # a slot vanished
    ],
)
def test_any_change_is_progress(after: tuple[SlotSample, ...], progressed: bool) -> None:
    summary = summarize((BUSY, IDLE), after)
    assert summary.progressed is progressed
    assert summary.total == 2 and summary.busy == 1


def test_one_sample_says_nothing_of_progress() -> None:
    assert summarize((BUSY, IDLE), None) == Slots(total=2, busy=1)
    assert summarize((BUSY,), None).all_busy
    assert not summarize((), None).all_busy


def test_free_at_last_reads_the_latest_sample() -> None:
    assert Slots(total=2, busy=2, busy_after=1).free_at_last
    assert not Slots(total=2, busy=1, busy_after=2).free_at_last
    assert Slots(total=2, busy=1).free_at_last
