"""What the console's parts (sessiond.web.pages, .api, .links) need of the server
that holds them: the seam that lets the server import its parts and the parts
know nothing of the server (sessiond.web.server's ``WebServer`` is the one
``Site``). The parts also reach each other through it: the pages render for the
API and the links, and a signed link's page is served on a page's route."""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from aiohttp import web

from sessiond.replies import Who
from sessiond.sdkwire import Message
from sessiond.syscalls.kernel import Kernel
from sessiond.web.auth import Auth
from sessiond.web.cluster import ClusterView
from sessiond.web.metrics import Metrics


class Rendering(Protocol):
    """The pages, as the other parts use them (sessiond.web.pages.Pages)."""

    def render(
        self, request: web.Request | None, template: str, status: int = 200, **context: Any
    ) -> web.Response: ...

    def error_page(
        self, message: str, status: int, request: web.Request | None = None
    ) -> web.Response: ...

    async def messages(self, name: str, before: int | None) -> tuple[list[Message], int | None]: ...


class LinkPage(Protocol):
    """A signed link's confirm page (sessiond.web.links.LinkPages)."""

    async def page(self, request: web.Request) -> web.Response: ...


class Site(Protocol):
    """The server, as its parts see it."""

    kernel: Kernel
    cluster: ClusterView
    metrics: Metrics
    auth: Auth
    closing: asyncio.Event  # set at shutdown: the event streams end

    @property
    def pages(self) -> Rendering: ...

    @property
    def links(self) -> LinkPage: ...

    def who(self, request: web.Request) -> Who:
        """Who acts, as the syscalls record it (only while the peer is connected)."""
        ...

    def user_of(self, request: web.Request | None) -> str: ...

    def csrf(self, request: web.Request | None) -> str: ...
