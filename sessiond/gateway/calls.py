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

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
import structlog
from aiohttp import web

from sessiond.errors import InvalidInput, Refused
from sessiond.gateway.budgets import Budgets, Refusal
from sessiond.gateway.places import Earlier, place, resumed_place
from sessiond.gateway.sched import Ask, GaveUp, Held, Scheduler, Throttled
from sessiond.gateway.shapes import Assembler, error_body, events, stop_of, text_of, usage_of
from sessiond.gateway.upstream import KIND_OF, Upstreams
from sessiond.ipc.params import SdkStepDoneParams, SdkStepParams
from sessiond.log.event_data import BudgetExhausted
from sessiond.log.records import TurnRecord
from sessiond.modelconfig import ModelConfig, ProviderConfig
from sessiond.replies import JsonObject
from sessiond.runs import wrapping
from sessiond.runs.agents import AGENT_KINDS
from sessiond.runs.modelenv import provider_keys
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
    # what the call gives back once its upstream answer is in (its budget hold)
    settled: list[Callable[[], None]] = field(default_factory=list)
    place: str = ""  # its step's key in the turn (gw.<n>), once taken


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
        # the calls sent upstream and not yet answered, by (session, turn, place)
        self._flying: dict[tuple[str, int | None, int], asyncio.Event] = {}
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
        turn = c.s.journal.state.turn
        digest = digest_of(c.body)  # once a call: a long conversation is costly to hash
        # its place, taken before any await (the run's calls may race each other)
        steps = turn["steps"] if turn is not None else {}
        n = self._place(c, turn, digest)
        if spec.run is not None and spec.run.kind in AGENT_KINDS:
            n = resumed_place(steps, c.grant.gateway_places, digest, n)
        c.grant.gateway_places.add(n)
        c.place = f"gw.{n}"
        flying = self._flying.get((c.s.name, turn["n"] if turn else None, n))
        if flying is not None:
            # an earlier run's call at this place is still in flight (its program went
            # away mid-stream, and the stream is read to its end): its answer is
            # waited for and replayed, never bought twice
            log.info("gateway.waits_for_earlier_call", session=c.s.name, place=n)
            await flying.wait()
            turn = c.s.journal.state.turn
            steps = turn["steps"] if turn is not None else {}
        recorded = steps.get(f"k:gw.{n}")
        hold = None
        if recorded is None or recorded["status"] != "ok":  # a replayed call costs nothing
            # what the calls in flight may still spend counts: sent at once, calls
            # pass a budget no further than sent one after another; an agent's
            # spend is every session's of it (after a start-up, the unopened ones'
            # from their index entries; one whose entry cannot say is opened first,
            # a budget or not: one a reload gives while this call waits counts it)
            if spec.agent:
                await self.kernel.ctx.table.ensure_spent(spec.agent)
            admitted = await self.budgets.admit(
                c.s.name, c.grant.run, turn["n"] if turn else None, spec.agent or None,
                spec.budget, len(c.raw) // 4, most_of(c),
            )  # fmt: skip
            if isinstance(admitted, Refusal):
                await self._over_budget(c, admitted)
            else:
                hold = admitted
                c.settled.append(lambda: self.budgets.release(admitted))
        try:
            return await self._begun(request, c, n, digest)
        finally:
            if hold is not None:
                self.budgets.release(hold)

    async def _begun(
        self, request: web.Request, c: Call, n: int, digest: str
    ) -> web.StreamResponse:
        spec = c.s.spec
        assert spec is not None
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
        if status in ("replayed", "run"):  # a step of the turn: an SDK model step under way
            wrapping.called(c.grant, c.place)  # (its fn made this call) wraps it
        if status == "replayed":
            return await self._replay(request, c, answer.get("result"))
        if status != "run":
            why = answer.get("rule") or answer.get("reason") or status
            raise Refuse(400, f"the daemon does not send this call: {why}")
        turn = c.s.journal.state.turn
        here = (c.s.name, turn["n"] if turn else None, n)
        flying = self._flying[here] = asyncio.Event()
        c.settled.append(flying.set)  # its answer is on record (or it failed)
        try:
            return await self._send(request, c, answer["call"])
        finally:
            flying.set()
            if self._flying.get(here) is flying:
                del self._flying[here]
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
        wrapping.answered(c.grant, c.place, response)
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
            return _passed(c.api, g.last.status, body, _keys(self.config, self.upstreams.env))
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
                return _passed(c.api, resp.status, body, _keys(self.config, self.upstreams.env))
            if "text/event-stream" in resp.headers.get("Content-Type", ""):
                c.settled.append(held.release)
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
        # the upstream is read at its own pace, whatever the program's: a program
        # that reads slowly, or never, holds its connection, never the model's slot
        # nor its budget (they are given back once the answer is in)
        assembler, chunks = Assembler(c.api), asyncio.Queue[bytes | None]()
        writer = asyncio.create_task(_write_all(out, chunks))
        complete = False
        try:
            try:
                keys, held_back = _keys(self.config, self.upstreams.env), b""
                async for chunk in resp.content.iter_any():
                    assembler.feed(chunk)
                    # a provider's key never reaches the program, even echoed (its
                    # record is then refused): masked, and what may begin one is held
                    # back until the next chunk says
                    safe, held_back = _masked(held_back + chunk, keys)
                    if safe:  # (an empty write may end a chunked answer)
                        chunks.put_nowait(safe)
                if held_back:
                    chunks.put_nowait(held_back)
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                await self._failed(c, call, started, f"the stream broke: {exc!r}")
                return out
            if assembler.result is None or not assembler.done:
                await self._failed(c, call, started, "the stream ended before its end")
                return out
            # the program may have gone away: the stream was read to its end all the
            # same, so what it cost is recorded and a later run replays it
            try:
                await self._record(c, call, ask, assembler.result, started)
            except Refuse:  # (logged) the program's stream ends without its end
                return out
            complete = True
            return out
        finally:
            for settle in c.settled:  # the upstream is done with: its slot, its hold
                settle()
            chunks.put_nowait(None)
            if await writer and complete:
                with contextlib.suppress(ConnectionError, RuntimeError):
                    await out.write_eof()

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
        turn = c.s.journal.state.turn
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
        wrapping.answered(c.grant, c.place, response)
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


# where each API asks for at most so many output tokens
OUTPUT_CAPS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


def most_of(c: Call) -> tuple[int | None, float | None]:
    """What a call may spend at most: its input's estimate and the output it caps
    (tokens, dollars); no bound (``None``) where it asks no cap."""
    est = max(1, len(c.raw) // 4)
    caps = [v for k in OUTPUT_CAPS if type(v := c.body.get(k)) is int and v >= 0]
    if not caps:
        return None, (0.0 if c.provider.cost(1, 1) is None else None)
    cost = c.provider.cost(est, min(caps))
    return est + min(caps), cost or 0.0


def _plain(_s: Session, reply: StepReply) -> StepAnswer:
    # the gateway answers HTTP, not the SDK: a stop the daemon wants reaches the
    # program at its next SDK call or by its run's end, not in a model's answer
    return {"stop": False, **reply}


MASK = b"[a provider key]"


def _keys(config: ModelConfig, env: dict[str, str]) -> list[bytes]:
    return [key.encode() for key in provider_keys(config, env)]


def _masked(data: bytes, keys: list[bytes]) -> tuple[bytes, bytes]:
    """``data`` with every key masked, split into what may go to the program now and
    the tail that could begin a key (held back until more comes)."""
    for key in keys:
        data = data.replace(key, MASK)
    hold = 0
    for key in keys:
        for n in range(min(len(key) - 1, len(data)), hold, -1):
            if data.endswith(key[:n]):
                hold = n
                break
    return data[: len(data) - hold], data[len(data) - hold :]


async def _write_all(out: web.StreamResponse, chunks: asyncio.Queue[bytes | None]) -> bool:
    """Write the chunks to the program until ``None``: whether it was listening to
    the end (``False``: it went away; the rest is not written)."""
    while (chunk := await chunks.get()) is not None:
        try:
            await out.write(chunk)
        except (ConnectionError, RuntimeError):
            return False
    return True


def _sse_response() -> web.StreamResponse:
    return web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )


def _passed(api: str, status: int, body: bytes, keys: list[bytes]) -> web.Response:
    """An upstream's error answered as it came where it is the provider's JSON, else
    in the provider's shape; never with a provider's key in it (one that says which
    key it refused)."""
    for key in keys:
        body = body.replace(key, MASK)
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
