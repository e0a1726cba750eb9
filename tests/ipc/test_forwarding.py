"""A reply carried back from another node raises the error the owner raised."""

from __future__ import annotations

from sessiond.errors import NoSuchSession, Refused, SessiondError
from sessiond.ipc.forwarding import Carried, error_of


def _reply(code: str, exit_code: int) -> dict[str, object]:
    return {"ok": False, "error": {"code": code, "message": "the owner's words", "exit": exit_code}}


def test_a_known_code_comes_back_as_its_own_class() -> None:
    exc = error_of(_reply("no_such_session", 4))
    assert type(exc) is NoSuchSession
    assert str(exc) == "the owner's words"
    assert type(error_of(_reply("refused", 1))) is Refused


def test_an_unknown_code_keeps_its_code_and_exit_code() -> None:
    exc = error_of(_reply("something_newer", 1))
    assert isinstance(exc, Carried)
    assert isinstance(exc, SessiondError)
    assert (exc.code, exc.exit_code, str(exc)) == ("something_newer", 1, "the owner's words")


def test_a_code_whose_class_takes_more_than_a_message_keeps_code_and_exit() -> None:
    exc = error_of(_reply("fell_behind", 1))  # FellBehind needs last_seq
    assert (exc.code, exc.exit_code) == ("fell_behind", 1)
