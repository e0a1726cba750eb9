"""The scripted upstream speaks the three APIs as the official SDKs parse them:
text, tool calls, stop reasons and usage, streamed and not; it counts what it
receives and acts out a provider's limits."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import openai
import pytest

from sessiond.gateway.scripted import Reply, Upstream, text, tool


@pytest.fixture
def up() -> Iterator[Upstream]:
    with Upstream() as u:
        yield u


def test_messages_plain_and_streamed(up: Upstream, request: pytest.FixtureRequest) -> None:
    up.add(
        Reply.of(text("hello"), input_tokens=12, output_tokens=3),
        Reply.of(text("look"), tool("Read", path="a.txt")),
    )
    client = anthropic.Anthropic(base_url=up.url, api_key="k", max_retries=0)
    request.addfinalizer(client.close)
    m = client.messages.create(
        model="m", max_tokens=10, messages=[{"role": "user", "content": "x"}]
    )
    assert m.content[0].text == "hello"  # type: ignore[union-attr]
    assert (m.stop_reason, m.usage.input_tokens, m.usage.output_tokens) == ("end_turn", 12, 3)
    with client.messages.stream(
        model="m", max_tokens=10, messages=[{"role": "user", "content": "x"}]
    ) as s:
        final = s.get_final_message()
    assert final.stop_reason == "tool_use"
    assert final.content[1].type == "tool_use"
    assert final.content[1].input == {"path": "a.txt"}
    assert up.count == 2


def test_chat_plain_and_streamed(up: Upstream, request: pytest.FixtureRequest) -> None:
    up.add(Reply.of(tool("get", city="Oslo"), input_tokens=7, output_tokens=2))
    client = openai.OpenAI(base_url=up.url + "/v1", api_key="k", max_retries=0)
    request.addfinalizer(client.close)
    c = client.chat.completions.create(model="g", messages=[{"role": "user", "content": "x"}])
    assert c.choices[0].finish_reason == "tool_calls"
    call = c.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert isinstance(call, openai.types.chat.ChatCompletionMessageFunctionToolCall)
    assert call.function.name == "get"
    assert call.function.arguments == '{"city":"Oslo"}'
    assert c.usage is not None
    assert c.usage.prompt_tokens == 7
    stream = client.chat.completions.create(
        model="g",
        messages=[{"role": "user", "content": "ping"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == "echo: ping"
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 5


def test_responses_plain_and_streamed(up: Upstream, request: pytest.FixtureRequest) -> None:
    up.add(Reply.of(text("one")), Reply.of(tool("shell", cmd="ls")))
    client = openai.OpenAI(base_url=up.url + "/v1", api_key="k", max_retries=0)
    request.addfinalizer(client.close)
    r = client.responses.create(model="g", input="x")
    assert r.output_text == "one"
    assert r.usage is not None
    assert r.usage.input_tokens == 10
    with client.responses.stream(model="g", input="x") as s:
        final = s.get_final_response()
    assert final.output[0].type == "function_call"
    assert final.output[0].name == "shell"


def test_limits_answer_429_with_retry_after(request: pytest.FixtureRequest) -> None:
    with Upstream([Reply.of(text("a"), hold=True)], concurrency=1) as up:
        client = anthropic.Anthropic(base_url=up.url, api_key="k", max_retries=0)
        request.addfinalizer(client.close)
        import threading

        held = threading.Thread(
            target=lambda: client.messages.create(
                model="m", max_tokens=5, messages=[{"role": "user", "content": "x"}]
            )
        )
        held.start()
        up.wait_count(1)
        with pytest.raises(anthropic.RateLimitError) as caught:
            client.messages.create(
                model="m", max_tokens=5, messages=[{"role": "user", "content": "y"}]
            )
        assert caught.value.response.headers["retry-after"] == "1"
        up.release()
        held.join(30)
        assert up.counts()["throttled"] == 1
        assert up.count == 2
