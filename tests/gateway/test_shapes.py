"""A whole response streamed (gateway.shapes.events) and assembled back (Assembler) is
the response again: what the gateway records of a stream, and streams on replay."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sessiond.gateway.shapes import Assembler, error_body, events, response_of, text_of, usage_of

blocks = st.lists(
    st.one_of(
        st.builds(lambda t: {"type": "text", "text": t}, st.text(min_size=1, max_size=50)),
        st.builds(
            lambda n, i, args: {"type": "tool_use", "id": f"toolu_{i}", "name": n, "input": args},
            st.from_regex(r"[a-z_]{1,12}", fullmatch=True),
            st.integers(0, 10**6),
            st.dictionaries(
                st.from_regex(r"[a-z]{1,6}", fullmatch=True),
                st.one_of(st.integers(-(2**53), 2**53), st.text(max_size=20)),
                max_size=3,
            ),
        ),
    ),
    max_size=4,
)


def assembled(api: str, response: dict[str, Any], cut: int = 1) -> dict[str, Any]:
    """The stream fed in pieces of ``cut`` bytes (events split anywhere)."""
    a = Assembler(api)
    data = b"".join(events(api, response))
    for i in range(0, len(data), cut):
        a.feed(data[i : i + cut])
    assert a.done
    assert a.result is not None
    return a.result


@given(
    blocks,
    st.integers(0, 10**6),
    st.integers(0, 10**6),
    st.sampled_from([None, "max_tokens"]),
    st.integers(1, 97),
)
def test_a_stream_assembles_to_its_response(
    content: list[dict[str, Any]], tin: int, tout: int, stop: str | None, cut: int
) -> None:
    for api in ("messages", "chat", "responses"):
        whole = response_of(
            api, content, model="m", n=1, input_tokens=tin, output_tokens=tout, stop=stop
        )
        back = assembled(api, whole, cut)
        assert usage_of(api, back) == (tin, tout)
        assert text_of(api, back) == text_of(api, whole)
        if api == "messages":
            assert back == whole
        elif api == "chat":
            assert back["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
            calls = whole["choices"][0]["message"].get("tool_calls")
            assert back["choices"][0]["message"].get("tool_calls") == calls
        else:
            assert back == whole


@pytest.mark.parametrize("status", [400, 401, 403, 404, 413, 429, 500, 529])
def test_errors_have_each_providers_shape(status: int) -> None:
    a = error_body("messages", status, "why")
    assert a["type"] == "error"
    assert a["error"]["message"] == "why"
    assert isinstance(a["error"]["type"], str)
    o = error_body("chat", status, "why")
    assert set(o["error"]) == {"message", "type", "param", "code"}
