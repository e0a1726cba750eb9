"""The compiled payload dumper (sessiond.log.dump) writes exactly what pydantic does."""

from __future__ import annotations

import math

import orjson
import pytest
from hypothesis import given

from sessiond.log import dump
from sessiond.log.event_data import PAYLOADS, ArtifactRef, BudgetExhausted, EventData, ToolFinished
from tests.strategies import PAYLOAD_STRATEGIES


def pydantic_dump(data: EventData) -> object:
    return data.__pydantic_serializer__.to_python(data, mode="json", by_alias=True)


@pytest.mark.parametrize("payload_type", PAYLOADS, ids=lambda p: p.EVENT_TYPE)
def test_every_payload_dumps_as_pydantic_does(payload_type: type[EventData]) -> None:
    assert dump.compile_dumper(payload_type) is not dump._pydantic, "no fast path for it"

    @given(PAYLOAD_STRATEGIES[payload_type])
    def check(payload: EventData) -> None:
        fast, slow = dump.dump_data(payload), pydantic_dump(payload)
        assert fast == slow
        # same bytes on the line: same keys, in the same order, same values
        assert orjson.dumps(fast) == orjson.dumps(slow)
        assert repr(fast) == repr(slow)  # lists stay lists, never tuples

    check()


def test_the_dump_shares_no_mutable_object_with_the_payload() -> None:
    payload = ToolFinished(call="c", tool="t", status="ok", hashes={"a": None}, result={"k": [1]})
    out = dump.dump_data(payload)
    out["hashes"]["b"] = None
    out["result"]["k"].append(2)
    assert payload.hashes == {"a": None}
    assert payload.result == {"k": [1]}


def test_an_alias_is_written_under_its_alias() -> None:
    from sessiond.log.event_data import LifecycleChanged

    out = dump.dump_data(LifecycleChanged(from_state="created", to="ready"))
    assert list(out)[:2] == ["from", "to"]


def test_values_it_does_not_expect_go_through_pydantic() -> None:
    class Sub(ArtifactRef):
        pass

    ref = Sub(ref="sha256:" + "a" * 64, name="x", size=1)
    payload = ToolFinished.model_construct(call="c", tool="t", status="ok", output=ref)
    assert dump.dump_data(payload) == pydantic_dump(payload)
    budget = BudgetExhausted.model_construct(budget="tokens", limit=math.inf, used=1)
    assert orjson.dumps(dump.dump_data(budget)) == orjson.dumps(pydantic_dump(budget))
    assert dump.dump_data(budget) == pydantic_dump(budget)
