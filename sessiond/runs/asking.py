"""Model calls sent while their request is being recorded (the gateway's).

A model step's request is recorded as its context, stored durably (the file and
its folder synced; for a long conversation, its new chunks too), then
``model.requested``, which is not synced on its own. Were a call sent upstream
only after that, every call would wait for those fsyncs before its round trip
to the provider instead of during it. So the gateway begins its steps
``early``: the call is sent at once and its request recorded meanwhile.

Why that keeps every promise: a model call changes nothing in the world. A call
whose request a crash lost before it was durable is the same as a step started
and not finished: the next run of the turn asks it again (runs.steps: an
earlier run's model step left waiting for its response is asked again, and the
gate holds no model step), and no response of it was given to anyone. What must hold is the
order: ``model.requested`` is in the log before ``model.responded`` and before
any of the response (a stream's first event included) reaches the program, and
the response reaches it only once ``model.responded`` is durable, so a program
never acts on an answer a crash could take out of the log. ``recorded`` is that
wait: ``Steps.done`` and the gateway's streams pass it first.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from sessiond.errors import InvalidInput, Refused


class Asking:
    """The requests being recorded, by session and call id (``r1.m2``: each
    session's runs count from 1)."""

    def __init__(self) -> None:
        self._tasks: dict[tuple[str, str], asyncio.Task[None]] = {}

    def start(self, session: str, call: str, record: Coroutine[Any, Any, None]) -> None:
        self._tasks[session, call] = asyncio.create_task(record)

    async def recorded(self, session: str, call: str) -> None:
        """Once the request of ``call`` is in the log (at once if it was not begun
        early). Raises Refused where it could not be recorded: nothing of the call
        is then in the log, and its response must not be given."""
        task = self._tasks.pop((session, call), None)
        if task is None:
            return
        try:
            await asyncio.shield(task)  # a cancelled waiter leaves the record to finish
        except (Refused, InvalidInput):
            raise
        except Exception as exc:  # a full disk, a failed log: nothing recorded
            raise Refused(f"the request of model call {call} could not be recorded: {exc}") from exc

    def forget(self, session: str, call: str) -> None:
        """The caller is done with ``call`` (answered, refused or cancelled): a request
        still being recorded goes on alone (a step started and never finished,
        asked again by a later run), and a failure of it is nobody's to raise."""
        task = self._tasks.pop((session, call), None)
        if task is not None:
            task.add_done_callback(_retrieved)


def _retrieved(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()  # looked at: no "exception was never retrieved"
