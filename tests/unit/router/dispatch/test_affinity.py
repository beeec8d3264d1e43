"""Prefix matching for routing: the leading text of each request shape, chained block
hashes (led by a ``prompt_cache_key``'s), and the bounded LRU index of one replica."""

from __future__ import annotations

from slm_server.router.dispatch.affinity import (
    BLOCK_CHARS,
    MAX_BLOCKS,
    PrefixIndex,
    block_hashes,
    leading_text,
    request_hashes,
)

SYSTEM = "You are a careful assistant. " * 20  # 580 characters: 9 whole blocks


def chat(*turns: str) -> dict[str, object]:
    return {
        "messages": [
            {"role": "system" if i == 0 else "user", "content": t} for i, t in enumerate(turns)
        ]
    }


def test_messages_in_order_with_their_roles() -> None:
    text = leading_text(chat("sys", "hello"))
    assert text == "\x1esystem\x1fsys\x1euser\x1fhello"


def test_content_parts_keep_their_text_only() -> None:
    payload = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "look"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                    {"type": "text", "text": " here"},
                ],
            }
        ]
    }
    assert leading_text(payload) == "\x1euser\x1flook here"


def test_prompt_input_and_instructions() -> None:
    assert leading_text({"prompt": "once upon"}) == "once upon"
    assert leading_text({"prompt": ["a", "b"]}) == "\x1ea\x1eb"
    assert leading_text({"input": "embed me"}) == "embed me"
    responses = {
        "instructions": "be brief",
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
    }
    assert leading_text(responses) == "be brief\x1euser\x1fhi"
    assert leading_text({"messages": "not a list"}) == ""
    assert leading_text({}) == ""


def test_leading_text_is_bounded() -> None:
    huge = chat(*["x" * 10_000 for _ in range(100)])
    assert len(leading_text(huge)) == BLOCK_CHARS * MAX_BLOCKS


def test_two_messages_differ_from_one_with_both_texts() -> None:
    one = leading_text({"messages": [{"role": "user", "content": "a\x1eb"}]})
    two = leading_text({"messages": [{"role": "user", "content": "a"}, {"content": "b"}]})
    assert one != two


def test_a_partial_block_hashes_nothing() -> None:
    assert block_hashes("x" * 63) == []
    assert len(block_hashes("x" * 64)) == 1


def test_block_hashes_chain_the_whole_prefix() -> None:
    base = block_hashes("a" * 64 + "b" * 64 + "c" * 64)
    assert len(base) == 3
    # The same third block after a different first block hashes differently.
    other = block_hashes("z" * 64 + "b" * 64 + "c" * 64)
    assert other[1:] != base[1:]
    # A common prefix gives common leading hashes; a partial last block adds none.
    longer = block_hashes("a" * 64 + "b" * 64 + "d" * 64 + "tail")
    assert longer[:2] == base[:2]
    assert longer[2] != base[2]
    assert len(longer) == 3


def test_the_index_matches_the_longest_recorded_prefix() -> None:
    index = PrefixIndex()
    first = block_hashes(leading_text(chat(SYSTEM, "What is a cat? " * 10)))
    index.record(first)
    assert index.match(first) == len(first)
    follow_up = block_hashes(leading_text(chat(SYSTEM, "Tell me about dogs. " * 10)))
    shared = 9  # the system prompt's whole blocks (and the role markers before them)
    assert index.match(follow_up) == shared
    assert index.match(block_hashes("unrelated " * 50)) == 0
    assert index.match([]) == 0


def test_the_index_is_bounded_and_forgets_the_oldest_prefix_first() -> None:
    index = PrefixIndex(capacity=20)
    old = block_hashes("o" * 64 * 10)
    index.record(old)  # the current generation is full (10, half the capacity)
    new = block_hashes("n" * 64 * 15)
    index.record(new)  # 10 into a new one, the old one kept; then 5 more: old dropped
    assert len(index) <= 20
    assert index.match(old) == 0
    assert index.match(new) == 15
    for n in range(100):
        index.record(block_hashes(f"{n:03d}" * 700))
        assert len(index) <= 20


def test_a_prefix_loses_its_last_blocks_first() -> None:
    index = PrefixIndex(capacity=16)
    shared = "s" * 64 * 4
    a, b = block_hashes(shared + "a" * 64 * 4), block_hashes(shared + "b" * 64 * 4)
    index.record(a)  # a4..a1, s4..s1: the current generation is full
    index.record(b)  # b4..b1 fill a new one; s4..s1 are sent again, to it too
    assert (index.match(a), index.match(b)) == (8, 8)
    index.record(block_hashes("c" * 64 * 2))  # a new generation: "a"'s last blocks go
    assert (index.match(a), index.match(b)) == (4, 8)


def test_a_prefix_sent_again_is_kept() -> None:
    index = PrefixIndex(capacity=8)
    kept = block_hashes("k" * 64 * 2)
    for n in range(20):
        index.record(kept)
        index.record(block_hashes(f"{n:02d}" * 32 * 2))
        assert index.match(kept) == 2


def test_recording_a_prefix_already_current_changes_nothing() -> None:
    index = PrefixIndex(capacity=100)
    hashes = block_hashes("r" * 64 * 5)
    index.record(hashes)
    index.record(hashes[:3])
    assert len(index) == 5
    assert index.match(hashes) == 5


def test_clear_forgets_everything() -> None:
    index = PrefixIndex()
    hashes = block_hashes("q" * 640)
    index.record(hashes)
    index.clear()
    assert index.match(hashes) == 0
    assert len(index) == 0


def test_a_prompt_cache_key_leads_the_blocks_and_seeds_their_chain() -> None:
    body = chat(SYSTEM, "hello")
    plain = request_hashes(body)
    assert plain == block_hashes(leading_text(body))
    keyed = request_hashes({**body, "prompt_cache_key": "session-1"})
    assert len(keyed) == len(plain) + 1
    assert not set(keyed) & set(plain)  # the same text under a key is another prefix
    again = request_hashes({**chat(SYSTEM, "a different turn"), "prompt_cache_key": "session-1"})
    assert again[0] == keyed[0]
    other = request_hashes({**body, "prompt_cache_key": "session-2"})
    assert other[0] != keyed[0]
    assert not set(other) & set(keyed)
    for no_key in ("", None, 3):
        assert request_hashes({**body, "prompt_cache_key": no_key}) == plain


def test_a_short_prompt_with_a_key_still_matches_where_the_key_went() -> None:
    index = PrefixIndex()
    index.record(request_hashes({"input": "hi", "prompt_cache_key": "k"}))
    assert index.match(request_hashes({"input": "other", "prompt_cache_key": "k"})) == 1
    assert index.match(request_hashes({"input": "other", "prompt_cache_key": "j"})) == 0
