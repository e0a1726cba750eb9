"""``sessionctl replay --view messages``: the view a page at a time.

The daemon builds each page from the log when asked (it keeps no copy of the
view: a long session's is large), so the client pages through with the
``next_cursor`` of each answer, and pins the next pages to the log as the first
one saw it (``upto``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sessiond.wire import Connection, Params

# for mypy only: sessionctl starts without building the reply types
if TYPE_CHECKING:
    from sessiond.replies import MessagesPage


def replay_messages(
    conn: Connection, params: Params, as_json: bool, emit: Callable[[Any], None]
) -> int:
    """Print the text as each page comes; with ``as_json``, one array at the end."""
    items: list[Any] = []
    cursor = None
    while True:
        page: MessagesPage = conn.call("replay", {**params, "cursor": cursor})
        if as_json:
            items += page["messages"]
        else:
            for m in page["messages"]:
                print(f"{m['role']:>9}: {m['content']}")
        cursor = page["next_cursor"]
        if cursor is None:
            break
        params = {**params, "upto": page["upto"]}
    if as_json:
        emit(items)
    return 0
