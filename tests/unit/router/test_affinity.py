"""Prefix matching for routing: the leading text of each request shape, chained block
hashes, and the bounded LRU index of one replica."""

from __future__ import annotations

from slm_server.router.affinity import (
    BLOCK_CHARS,
    MAX_BLOCKS,
    PrefixIndex,
    block_hashes,
    leading_text,
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
    index.record(old)
    new = block_hashes("n" * 64 * 15)
    index.record(new)
    assert len(index) == 20
    assert index.match(new) == 15
    # The old prefix lost its last blocks first: what is left is still its beginning.
    assert index.match(old) == 5


def test_recording_keeps_a_prefix_s_first_blocks_the_most_recent() -> None:
    index = PrefixIndex(capacity=14)
    shared = "s" * 64 * 4
    a, b = block_hashes(shared + "a" * 64 * 4), block_hashes(shared + "b" * 64 * 4)
    index.record(a)
    index.record(b)  # the shared blocks are the most recent again
    index.record(block_hashes("c" * 64 * 4))  # 16 distinct: "a"'s last two go
    assert (index.match(a), index.match(b)) == (6, 8)
    index.record(block_hashes("d" * 64 * 2))  # then "a"'s other two, never the shared
    assert (index.match(a), index.match(b)) == (4, 8)


def test_clear_forgets_everything() -> None:
    index = PrefixIndex()
    hashes = block_hashes("q" * 640)
    index.record(hashes)
    index.clear()
    assert index.match(hashes) == 0
    assert len(index) == 0
