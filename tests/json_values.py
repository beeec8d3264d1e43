"""Hypothesis strategies for any JSON value a client or a backend may send: what the
fuzz tests feed the router's translations, sized per test."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st


def json_values(
    *, text: int = 20, size: int = 4, leaves: int = 12, integers: int = 10**30
) -> st.SearchStrategy[Any]:
    """Any JSON value: null, booleans, integers within ``integers``, finite floats,
    strings of at most ``text`` characters, and lists and objects of at most ``size``
    items nested up to ``leaves`` scalars in all."""
    scalars = (
        st.none()
        | st.booleans()
        | st.integers(min_value=-integers, max_value=integers)
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(max_size=text)
    )
    return st.recursive(
        scalars,
        lambda children: (
            st.lists(children, max_size=size)
            | st.dictionaries(st.text(max_size=max(1, text // 2)), children, max_size=size)
        ),
        max_leaves=leaves,
    )
