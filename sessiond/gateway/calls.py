"""One model call through the gateway, as a durable step of its run's turn.

The run is known by its token (the ``x-api-key`` or ``Authorization: Bearer`` of the
request: the run's own token, runs.tokens) and the address it called (``/run/
<session>/<run>/``): both must name the same live run. Then the request is checked
(JSON, a model some provider serves, a model the session's spec allows, a size we
take) and becomes a step at its place in the turn, keyed ``gw.<n>``: the place an
earlier run recorded the same request at, else the run's next (:func:`place`).
runs.steps answers it:

- ``replayed``: a call of an earlier run of the turn finished at this place: its
  recorded response is answered, streamed as the provider streams it when the call
  asks a stream (gateway.shapes), and nothing goes upstream;
- ``run``: ``model.requested`` is recorded, the call waits for its turn at the model
  (the scheduler), goes upstream, and ``model.responded`` records the response (a
  stream's assembled response) with its usage, cost, stop reason and latency.

Anything refused is answered in the provider's own error shape and changes nothing.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
import structlog
from aiohttp import web

from sessiond.errors import InvalidInput, Refused
from sessiond.gateway.budgets import Budgets, Refusal
from sessiond.gateway.sched import Ask, GaveUp, Held, Scheduler, Throttled
from sessiond.gateway.shapes import Assembler, error_body, events, stop_of, text_of, usage_of
from sessiond.gateway.upstream import KIND_OF, Upstreams
from sessiond.ipc.params import SdkStepDoneParams, SdkStepParams
from sessiond.log.event_data import BudgetExhausted
from sessiond.log.records import TurnRecord
from sessiond.modelconfig import ModelConfig, ProviderConfig
from sessiond.replies import JsonObject
from sessiond.runs.agents import AGENT_KINDS
from sessiond.runs.steps import digest_of
from sessiond.runs.tokens import RunGrant, TokenRefused
from sessiond.sdkwire import StepAnswer, StepReply
from sessiond.syscalls.kernel import Kernel
from sessiond.table.sessions import Session

log = structlog.get_logger(__name__)


class Refuse(Exception):
    """A call answered with an error in the provider's shape, nothing recorded."""

    def __init__(self, status: int, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


@dataclass
class Call:
    """A checked call: who asks, what, and where it goes."""

    s: Session
    grant: RunGrant
    token: str
    api: str
    model: str
    provider: ProviderConfig
    body: JsonObject  # a provider API's request: any JSON object naming its model
    raw: bytes
    stream: bool


def token_of(request: web.Request) -> str | None:
    given = request.headers.get("x-api-key")
    if given:
        return given
    auth = request.headers.get("Authorization", "")
    scheme, _, value = auth.partition(" ")
    return (value.strip() or None) if scheme.lower() == "bearer" else None


def retry_after(headers: Any) -> float | None:
    try:
        value = float(headers.get("Retry-After", ""))
    except ValueError:
        return None
    return value if value >= 0 else None


class Calls:
    """The gateway's calls for one daemon."""

    def __init__(self, kernel: Kernel, scheduler: Scheduler, budgets: Budgets) -> None:
        self.kernel = kernel
        self.scheduler = scheduler
        self.budgets = budgets
        self.upstreams = Upstreams(kernel.ctx.env)
        self._earlier = Earlier()

    @property
    def config(self) -> ModelConfig:
        return self.kernel.ctx.config.model  # replaced on reload

    async def handle(self, request: web.Request, api: str) -> web.StreamResponse:
        try:
            call = await self._checked(request, api)
            return await self._step(request, call)
        except Refuse as r:
            return _json(error_body(api, r.status, r.message, r.code), r.status)

    # --- the checks: who, what (nothing recorded) ------------------------------------

    async def _checked(self, request: web.Request, api: str) -> Call:
        token = token_of(request)
        if not token:
            raise Refuse(
                401,
                "no API key: a run's calls carry its token, the API key the daemon put in "
                "its environment (ANTHROPIC_API_KEY, OPENAI_API_KEY)",
            )
        try:
            s, grant = self.kernel.tokens.session_for(token)
        except TokenRefused as exc:
            raise Refuse(401, f"the API key is not valid here: {exc}") from None
        where = (request.match_info.get("session"), request.match_info.get("run"))
        if where != (grant.session, grant.run):
            raise Refuse(
                401,
                "the API key belongs to another run than this address's: a run calls its "
                "own address (ANTHROPIC_BASE_URL, OPENAI_BASE_URL) with its own key",
            )
        raw = await self._body(request)
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise Refuse(400, f"the request body is not valid JSON: {exc}") from None
        model = body.get("model") if isinstance(body, dict) else None
        if not isinstance(model, str):
            raise Refuse(400, 'the request must be a JSON object naming its model ("model")')
        provider = self.config.provider_for(model)
        if provider is None:
            served = ", ".join(m for p in self.config.provider for m in p.models)
            raise Refuse(
                404,
                f"model {model!r} is not served by this daemon (its providers serve: {served}); "
                "add it to a [[model.provider]]'s models in the daemon's configuration",
            )
        if provider.kind != KIND_OF[api]:
            raise Refuse(
                400,
                f"model {model!r} is served by an {provider.kind} provider: call it through "
                + ("/v1/messages" if provider.kind == "anthropic" else "/v1/chat/completions"),
            )
        spec = s.spec
        assert spec is not None
        if not spec.model.allows(model):
            allowed = ", ".join(spec.model.allow) or "none"
            raise Refuse(
                403,
                f"session {s.name!r} may not use model {model!r} (its spec allows: {allowed}); "
                "add it to [model] allow in the session's spec",
            )
        return Call(s, grant, token, api, model, provider, body, raw, bool(body.get("stream")))

    async def _body(self, request: web.Request) -> bytes:
        limit = self.config.max_body
        too_big = Refuse(
            413,
            f"the request body is larger than the gateway takes ({limit} bytes, [model] "
            "max_body in the daemon's configuration)",
        )
        if request.content_length is not None and request.content_length > limit:
            raise too_big
        parts, size = [], 0
        async for chunk in request.content.iter_chunked(1 << 16):
            size += len(chunk)
            if size > limit:
                raise too_big
            parts.append(chunk)
        return b"".join(parts)

    # --- the step --------------------------------------------------------------------

    async def _step(self, request: web.Request, c: Call) -> web.StreamResponse:
        spec = c.s.spec
        assert spec is not None
        turn = c.s.j.state.turn
        digest = digest_of(c.body)  # once a call: a long conversation is costly to hash
        # its place, taken before any await (the run's calls may race each other)
        steps = turn["steps"] if turn is not None else {}
        n = self._place(c, turn, digest)
        if spec.run is not None and spec.run.kind in AGENT_KINDS:
            n = resumed_place(steps, c.grant.gateway_places, digest, n)
        c.grant.gateway_places.add(n)
        recorded = steps.get(f"k:gw.{n}")
        if recorded is None or recorded["status"] != "ok":  # a replayed call costs nothing
            refusal = self.budgets.check(
                c.s.name, c.grant.run, turn["n"] if turn else None, spec.agent or None,
                spec.budget, len(c.raw) // 4,
            )  # fmt: skip
            if refusal is not None:
                await self._over_budget(c, refusal)
        asked = SdkStepParams(
            token=c.token, kind="model", name=c.model, ordinal=1, key=f"gw.{n}",
            key_is_id=True, request=c.body, strict=spec.model.strict,
        )  # fmt: skip
        sdk_steps = self.kernel.sdk.steps
        try:
            # early: sent while its request is recorded (runs.asking says why that is safe)
            answer = await sdk_steps.begin(c.s, c.grant, asked, _plain, digest=digest, early=True)
        except (InvalidInput, Refused) as exc:
            raise Refuse(400, str(exc)) from None
        status = answer["status"]
        if status == "replayed":
            return await self._replay(request, c, answer.get("result"))
        if status != "run":
            why = answer.get("rule") or answer.get("reason") or status
            raise Refuse(400, f"the daemon does not send this call: {why}")
        try:
            return await self._send(request, c, answer["call"])
        finally:
            sdk_steps.asking.forget(c.s.name, answer["call"])

    def _place(self, c: Call, turn: TurnRecord | None, digest: str) -> int:
        """``place``, without a pass over every step of a long turn for each call: the
        first run of a turn has no earlier run's places to find, and a later run
        looks its request up among those recorded finished before it began."""
        taken = c.grant.gateway_places
        if turn is None or turn["runs"] <= 1:
            return place({}, taken, digest)
        steps = turn["steps"]
        for n in self._earlier.places(c.s.name, turn).get(digest, ()):
            st = steps.get(f"k:gw.{n}") if n not in taken else None
            if st is not None and st.get("digest") == digest and st.get("status") == "ok":
                return n
        return place(steps, taken, digest)  # a new request (or one finished since)

    async def _over_budget(self, c: Call, refusal: Refusal) -> None:
        """Refused for a budget: recorded as a spent budget, and the run stops so the
        session is suspended with the reason (runs.settle), as any spent budget does."""
        s = c.s
        async with s.lock:
            await self.kernel.ctx.table.append(
                s,
                BudgetExhausted(budget=refusal.budget, limit=refusal.limit, used=refusal.used),
            )
            if s.run is not None and s.run.stop_requested is None:
                s.run.stop_requested = refusal.reason  # "budget: tokens_per_day: N of M used"
        raise Refuse(429, f"budget spent: {refusal.message}", "insufficient_quota")

    async def _replay(self, request: web.Request, c: Call, recorded: Any) -> web.StreamResponse:
        if not isinstance(recorded, dict) or recorded.get("api") != c.api:
            was = recorded.get("api") if isinstance(recorded, dict) else "an SDK model_call"
            raise Refuse(
                400,
                f"this place in the turn recorded a call of another API ({was}): a later run "
                "of a turn makes the same calls in the same order",
            )
        response = recorded["response"]
        if not c.stream:
            return _json(response)
        out = _sse_response()
        await out.prepare(request)
        for chunk in events(c.api, response):
            await out.write(chunk)
        await out.write_eof()
        return out

    async def _send(self, request: web.Request, c: Call, call: str) -> web.StreamResponse:
        spec = c.s.spec
        assert spec is not None
        started = time.monotonic()
        ask = Ask(
            session=c.s.name, agent=spec.agent or None, priority=spec.priority,
            provider=c.provider.name, model=c.model, est_tokens=max(1, len(c.raw) // 4),
        )  # fmt: skip
        headers = {k.lower(): v for k, v in request.headers.items()}

        async def send() -> aiohttp.ClientResponse:
            resp = await self.upstreams.send(c.provider, c.api, c.raw, headers)
            if resp.status in (429, 529):
                body = await resp.read()
                resp.release()
                raise Throttled(retry_after(resp.headers), resp.status, body)
            return resp

        try:
            held: Held[aiohttp.ClientResponse] = await self.scheduler.open(ask, send)
        except GaveUp as g:
            await self._failed(c, call, started, f"upstream answered {g.last.status}")
            body = g.last.body if isinstance(g.last.body, bytes) else b""
            return _passed(c.api, g.last.status, body)
        except KeyError as exc:
            await self._failed(c, call, started, "no key")
            raise Refuse(
                502, f"the daemon cannot read provider {c.provider.name!r}'s key: {exc.args[0]}"
            ) from None
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            await self._failed(c, call, started, f"upstream unreachable: {exc!r}")
            raise Refuse(
                502, f"provider {c.provider.name!r} could not be reached: {exc!r}"
            ) from None
        resp = held.value
        try:
            if resp.status != 200:
                body = await resp.read()
                await self._failed(c, call, started, f"upstream answered {resp.status}")
                return _passed(c.api, resp.status, body)
            if "text/event-stream" in resp.headers.get("Content-Type", ""):
                return await self._stream(request, c, call, resp, ask=ask, started=started)
            data = await resp.read()
            try:
                response = orjson.loads(data)
            except orjson.JSONDecodeError:
                await self._failed(c, call, started, "the upstream's answer is not JSON")
                raise Refuse(502, "the provider's answer is not JSON") from None
            await self._record(c, call, ask, response, started)
            return web.Response(body=data, content_type="application/json")
        finally:
            resp.release()
            held.release()

    async def _stream(
        self,
        request: web.Request,
        c: Call,
        call: str,
        resp: aiohttp.ClientResponse,
        *,
        ask: Ask,
        started: float,
    ) -> web.StreamResponse:
        await self._asked(c, call)  # before the stream's first event
        out = _sse_response()
        await out.prepare(request)
        assembler, listening = Assembler(c.api), True
        try:
            async for chunk in resp.content.iter_any():
                assembler.feed(chunk)
                if listening:
                    try:
                        await out.write(chunk)
                    except (ConnectionError, RuntimeError):
                        # the program went away: the stream is read to its end all the
                        # same, so what it cost is recorded and a later run replays it
                        listening = False
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            await self._failed(c, call, started, f"the stream broke: {exc!r}")
            return out
        if assembler.result is None or not assembler.done:
            await self._failed(c, call, started, "the stream ended before its end")
            return out
        await self._record(c, call, ask, assembler.result, started)
        if listening:
            with contextlib.suppress(ConnectionError, RuntimeError):
                await out.write_eof()
        return out

    # --- the record ------------------------------------------------------------------

    async def _record(
        self, c: Call, call: str, ask: Ask, response: JsonObject, started: float
    ) -> None:
        spec = c.s.spec
        assert spec is not None
        tokens_in, tokens_out = usage_of(c.api, response)
        cost = c.provider.cost(tokens_in, tokens_out)
        stop = stop_of(c.api, response)
        self.scheduler.settle(ask, tokens_in + tokens_out)
        turn = c.s.j.state.turn
        self.budgets.charge(
            c.s.name, c.grant.run, turn["n"] if turn else None, spec.agent or None,
            tokens_in, tokens_out, cost or 0.0,
        )  # fmt: skip
        done = SdkStepDoneParams(
            token=c.token, call=call, status="ok",
            result={"api": c.api, "stop_reason": stop, "response": response},
            tokens_in=tokens_in, tokens_out=tokens_out, cost_usd=cost,
            text=text_of(c.api, response), duration_ms=int((time.monotonic() - started) * 1000),
        )  # fmt: skip
        await self._asked(c, call)
        try:
            await self.kernel.sdk.steps.done(c.s, c.grant, done)
        except (InvalidInput, Refused) as exc:
            log.warning("gateway.unrecorded", session=c.s.name, call=call, error=str(exc))
            raise Refuse(400, str(exc)) from None

    async def _asked(self, c: Call, call: str) -> None:
        """Wait until the call's request is in the log: nothing of a response reaches
        the program before (runs.asking). Where it could not be recorded (a full
        disk, say), the response is not given: nothing of the call is in the log."""
        try:
            await self.kernel.sdk.steps.asking.recorded(c.s.name, call)
        except Refused as exc:
            log.warning("gateway.unrecorded", session=c.s.name, call=call, error=str(exc))
            raise Refuse(500, str(exc)) from None

    async def _failed(self, c: Call, call: str, started: float, why: str) -> None:
        done = SdkStepDoneParams(
            token=c.token, call=call, status="error", error=why[:60_000],
            error_class="provider", duration_ms=int((time.monotonic() - started) * 1000),
        )  # fmt: skip
        try:
            await self.kernel.sdk.steps.done(c.s, c.grant, done)
        except (InvalidInput, Refused) as exc:
            log.warning("gateway.unrecorded", session=c.s.name, call=call, error=str(exc))


class Earlier:
    """The places the earlier runs of each session's open turn recorded finished,
    by request digest: read at a run's first call (what earlier runs recorded does
    not change while it runs), one pass, then looked up."""

    def __init__(self) -> None:
        # session -> ((turn, runs), digest -> places, ascending)
        self._of: dict[str, tuple[tuple[int, int], dict[str, list[int]]]] = {}

    def places(self, session: str, turn: TurnRecord) -> dict[str, list[int]]:
        at = (turn["n"], turn["runs"])
        known = self._of.get(session)
        if known is not None and known[0] == at:
            return known[1]
        found: dict[str, list[int]] = {}
        for slot, st in turn["steps"].items():
            digest = st.get("digest")
            if digest and st["status"] == "ok" and slot.startswith("k:gw.") and slot[5:].isdigit():
                found.setdefault(digest, []).append(int(slot[5:]))
        for places in found.values():
            places.sort()
        self._of[session] = (at, found)
        return found


# steps: the turn's (StepRecord by slot), any mapping of the keys read (the unit tests')
def place(steps: dict[str, Any], taken: set[int], digest: str) -> int:
    """The place ``gw.<n>`` of a call in its turn: the first place an earlier run
    recorded for the very same request (its digest) that this run has not taken, so
    calls sent at once (``asyncio.gather``, threads) find their own records whatever
    order they arrive in; else the first place this run has not taken (in call order:
    a changed request, or a new call)."""
    # one plain pass, the digest first (it rules out nearly every other step): this
    # runs for every call, over every step of the turn
    best = 0
    for slot, st in steps.items():
        if (
            st.get("digest") == digest
            and st.get("status") == "ok"
            and slot.startswith("k:gw.")
            and slot[5:].isdigit()
        ):
            n = int(slot[5:])
            if n not in taken and (not best or n < best):
                best = n
    if best:
        return best
    # the places a run takes are mostly 1..k: then the next is k + 1 at once
    n = len(taken) + 1 if taken and max(taken) == len(taken) else 1
    while n in taken:
        n += 1
    return n


def resumed_place(steps: dict[str, Any], taken: set[int], digest: str, n: int) -> int:  # as place
    """The place of an agent CLI's call (``claude-code``, ``codex``): the CLI resumes
    its own history in a later run of the turn, so a call is an earlier run's only
    for the very same request; any other is a new place after those the turn
    recorded, never answered with the response to another request."""
    recorded = steps.get(f"k:gw.{n}")
    if recorded is None or recorded.get("digest") == digest:
        return n
    while n in taken or f"k:gw.{n}" in steps:
        n += 1
    return n


def _plain(_s: Session, reply: StepReply) -> StepAnswer:
    # the gateway answers HTTP, not the SDK: a stop the daemon wants reaches the
    # program at its next SDK call or by its run's end, not in a model's answer
    return {"stop": False, **reply}


def _sse_response() -> web.StreamResponse:
    return web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )


def _passed(api: str, status: int, body: bytes) -> web.Response:
    """An upstream's error answered as it came where it is the provider's JSON, else
    in the provider's shape."""
    try:
        parsed = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict) or "error" not in parsed:
        parsed = error_body(api, status, f"the provider answered {status}")
    return _json(parsed, status)


def _json(value: Any, status: int = 200) -> web.Response:
    """A JSON answer encoded by orjson (aiohttp's json_response: the standard json)."""
    return web.Response(body=orjson.dumps(value), status=status, content_type="application/json")
