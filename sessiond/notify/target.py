"""One ``[[notify]]`` target: its queue of notices, delivered in order through
Apprise, retried with backoff, its state for ``sessionctl notify``.

Apprise's send blocks (HTTP, SMTP…), so it runs in a worker thread; the loop
only waits for it. A notice leaves the queue once it is delivered and the
cursor says so durably; a failure keeps it at the head and tries again after
``retry_min``, doubling to ``retry_max``. Order is kept: a failing target holds
its later notices back rather than send them out of order.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
import warnings
from collections import deque
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import structlog

from sessiond.config import BadConfig, NotifyConfig
from sessiond.notify import jsonl
from sessiond.notify.cursor import Cursor
from sessiond.notify.notices import Notice, rendered
from sessiond.replies import TargetStatus

log = structlog.get_logger(__name__)

# Apprise's own webhooks (JSON, form, XML) take extra payload fields (":key=value")
# and headers ("+Name=value") in their URL: there each notice carries its id as data.
WEBHOOKS = frozenset({"json", "jsons", "form", "forms", "xml", "xmls"})


def load_apprise() -> Any:
    """Import Apprise and load its plugins (once, in the loop: it warns on import)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import apprise

        apprise.Apprise.instantiate("json://localhost")  # loads every plugin now
    return apprise


def target_id(config: NotifyConfig) -> str:
    """What keys a target's cursor: its name, or its URL's digest."""
    return config.name or "url-" + hashlib.sha256(config.url.encode()).hexdigest()[:16]


class Target:
    def __init__(
        self, config: NotifyConfig, cursor: Cursor, apprise: Any, state_dir: Path | None = None
    ) -> None:
        self.config = config
        self.id = target_id(config)
        self.cursor = cursor
        self.apprise = apprise
        self.scheme = urlsplit(config.url).scheme.lower()
        self.file: Path | None = None
        if self.scheme == jsonl.SCHEME:  # a file of ours, not an Apprise service
            try:
                self.file = jsonl.path_of(config.url, state_dir or Path("."))
            except ValueError as exc:
                raise BadConfig(f"notify {self.id}: {exc}") from None
            self.shown_url = config.url
        else:
            plugin = apprise.Apprise.instantiate(config.url)
            if plugin is None:
                raise BadConfig(
                    f"notify {self.id}: {config.url.split('://')[0]}://… is not a URL Apprise "
                    "knows; see Apprise's list of services (ntfy://, slack://, json://, "
                    "mailto://…), or jsonl://FILE for a file"
                )
            self.shown_url = str(plugin.url(privacy=True))
        self.wanted = frozenset(config.events)
        self.queue: deque[Notice] = deque()
        self._more = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.delivered = 0
        self.failures = 0  # failed attempts since the last delivery
        self.failed_total = 0
        self.last_error: str | None = None
        self.last_error_at: float | None = None
        self.last_delivered_at: float | None = None
        self.next_try_at: float | None = None
        self.crashed: str | None = None  # the delivery loop ended by a bug (restart to retry)

    # --- the queue -----------------------------------------------------------------

    def put(self, notice: Notice) -> None:
        self.queue.append(notice)
        self._more.set()

    def first_pending(self) -> dict[str, int]:
        """Each session's first seq still to deliver (one pass over the queue)."""
        firsts: dict[str, int] = {}
        for n in self.queue:
            firsts.setdefault(n.session, n.seq)
        return firsts

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._deliver_all())
        self._task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        """A delivery loop that ended by a bug says so, in the log and the status."""
        if not task.cancelled() and (exc := task.exception()) is not None:
            self.crashed = f"{type(exc).__name__}: {exc}"
            log.error("notify.crashed", target=self.id, error=self.crashed)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            # a crash was logged by _ended
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        self.cursor.close()

    async def _deliver_all(self) -> None:
        while True:
            while not self.queue:
                self._more.clear()
                await self._more.wait()
            notice = self.queue[0]
            error = await asyncio.to_thread(self._send, notice)
            if error is None:
                # durable before the notice leaves the queue: a kill after the send
                # and before this write is the only way it is sent again
                try:
                    await asyncio.to_thread(
                        self.cursor.advance, notice.session, notice.seq, sync=True
                    )
                except OSError as exc:  # delivered, not recorded: sent again, as after a kill
                    error = f"delivered, but its cursor could not be written: {exc}"
            if error is None:
                self.queue.popleft()
                self.delivered += 1
                self.failures = 0
                self.last_delivered_at = time.time()
                self.next_try_at = None
                log.info("notify.delivered", target=self.id, notice=notice.id, kind=notice.event)
                continue
            self.failures += 1
            self.failed_total += 1
            self.last_error, self.last_error_at = error, time.time()
            doublings = min(self.failures - 1, 40)  # 2**40 s is past any retry_max
            delay = min(self.config.retry_min * 2**doublings, self.config.retry_max)
            self.next_try_at = time.time() + delay
            log.warning(
                "notify.failed",
                target=self.id,
                notice=notice.id,
                attempt=self.failures,
                retry_in=delay,
                error=error,
            )
            await asyncio.sleep(delay)  # the backoff itself: nothing to wait on but time

    # --- the send (a worker thread) ------------------------------------------------

    def url_for(self, notice: Notice) -> str:
        """The target's URL for this notice: a webhook's gets the id as data and header."""
        if self.scheme not in WEBHOOKS:
            return self.config.url
        fields = {
            ":notice_id": notice.id,
            ":session": notice.session,
            ":seq": str(notice.seq),
            ":event": notice.event,
            ":event_type": notice.type,
            ":ts": notice.ts,
            "+X-Sessiond-Notice-Id": notice.id,
        }
        if notice.link is not None:
            fields[":link"] = notice.link
        for label, url in notice.actions:
            fields[f":{label}_url"] = url
        query = "&".join(f"{quote(k, safe=':+')}={quote(v, safe='')}" for k, v in fields.items())
        return self.config.url + ("&" if "?" in self.config.url else "?") + query

    def _send(self, notice: Notice) -> str | None:
        """Deliver one notice; None, or what went wrong in a line."""
        if self.file is not None:
            try:
                jsonl.append(self.file, notice)
            except OSError as exc:
                return f"cannot append to {self.file}: {exc.strerror or exc}"
            return None
        apprise = self.apprise
        sender = apprise.Apprise()
        if not sender.add(self.url_for(notice)):
            return "Apprise refused the target's URL for this notice"
        with apprise.LogCapture(level=apprise.logging.WARNING) as captured:
            try:
                ok = bool(
                    sender.notify(
                        body=rendered(notice), title=notice.title, notify_type=notice.level
                    )
                )
            except Exception as exc:  # a plugin's bug must not end the delivery loop
                return f"{type(exc).__name__}: {exc}"
        if ok:
            return None
        lines = [ln.split(" - ", 2)[-1] for ln in captured.getvalue().splitlines() if ln.strip()]
        return "; ".join(lines)[-500:] or "Apprise could not deliver it (no reason given)"

    # --- for `sessionctl notify` ---------------------------------------------------

    def status(self) -> TargetStatus:
        return {
            "target": self.id,
            "url": self.shown_url,
            "events": list(self.config.events),
            "state": "stopped" if self.crashed else ("failing" if self.failures else "ok"),
            "pending": len(self.queue),
            "delivered": self.delivered,
            "failures": self.failures,
            "failed_total": self.failed_total,
            "last_error": self.crashed or self.last_error,
            "last_error_at": _iso(self.last_error_at),
            "last_delivered_at": _iso(self.last_delivered_at),
            "next_try_at": _iso(self.next_try_at) if self.failures else None,
        }


def _iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))
