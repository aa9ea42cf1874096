"""The mirror of one target (a shadow candidate, or a quality watch's reference): a
bounded queue, its own workers and HTTP client. Each target has a mirror of its own, so a
reference that cannot keep up drops its own samples and never delays the candidate's.

Beside the request path, never in it (Envoy's request mirroring: fire and forget): the
data plane answers its caller first, then `offer`s the request's decoded inputs and its
own outputs here. `offer` never awaits and never raises; it samples (`Sampler`), and
admits the request only while the queue holds fewer than `maxQueueSize` requests and
`maxQueuedBytes` of tensors, else counts it `dropped`. `maxConcurrency` workers send the
queued requests to the candidate, each bounded by `timeoutMilliseconds`, so a dead, slow
or erroring candidate costs at most a full queue and a few idle tasks, and changes nothing
for the callers.

The request to the candidate is built from the decoded inputs with Triton's binary tensor
extension both ways (`encode_infer_request`), so the comparison sees the candidate's exact
floats and neither side formats JSON numbers. The candidate's latency is its own server
time from its `Server-Timing` header, the same span this runtime reports for itself;
when a candidate sends none, the round trip measured here stands in (it includes the
network, so it flatters the serving side: a reason to keep candidates on kubeinfer).

A mirror made with `gather_rows` above 1 (a quality watch's: the reference runs the same
batching, so it takes that many rows) sends several sampled requests as one: a worker
takes the first queued request, waits up to `gather_seconds` for others (less once a
full batch, or half of what the queue may hold, is queued; one worker gathers at a time
while the others send), and stacks the rows of those that have the same inputs and
outputs past dimension 0 (`stack_key`), up to `gather_rows` rows; the answer's rows are
then compared request by request (`compare_requests`). The HTTP client and the numpy
calls of a comparison cost the serving CPU per request sent, far more than per row, so
this is what keeps the watch cheap; each request of a gathered batch gets the batch's
latency from the reference, a figure nothing judges for a watch. A shadow's mirror
sends each request alone, as its latency is compared with the serving side's.

Failures are counted by outcome (`candidate_error`, `timeout`) and logged per request at
DEBUG only; a WARNING summarises them at most once per `log_interval_seconds`, so a
broken candidate never floods the log with a traceback per request. A candidate that
refuses connections (stopped, not yet started, gone) is not asked again for a while:
sampled requests are counted `candidate_error` at once, without a connection attempt, for
0.25 s after the refusal, doubling with each refusal in a row up to 4 s. A dead candidate
then costs a few connection attempts a second rather than one per mirrored request, each
on this runtime's event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
from kubeinfer.contract.runtime_config import MirrorTarget
from kubeinfer.runtime.protocol.tensor_codec import decode_infer_response, encode_infer_request
from kubeinfer.runtime.protocol.v2_types import (
    HEADER_LENGTH_HEADER,
    SERVER_TIMING_HEADER,
    InferInput,
    parse_server_timing,
)
from kubeinfer.runtime.shadow.aggregates import RunningAggregates
from kubeinfer.runtime.shadow.comparison import (
    Outputs,
    compare_requests,
    request_rows,
    stack_requests,
)
from kubeinfer.runtime.shadow.sampling import Sampler

log = logging.getLogger(__name__)

_CLOSE_WAIT_SECONDS = 1.0
_BACKOFF_SECONDS = (0.25, 4.0)  # after a refused connection: first, and most


@dataclass(slots=True)
class MirroredRequest:
    """A request answered 200 by this runtime, waiting to be sent to the candidate."""

    inputs: Outputs
    """Its decoded inputs by name, as (datatype, array)."""

    serving: Outputs
    """This runtime's outputs by name, as (datatype, array)."""

    serving_seconds: float
    """This runtime's server time for it."""

    nbytes: int
    """Bytes of tensors it holds (inputs and outputs)."""

    slice_value: str | None = None
    """The raw value of the quality watch's slice header, if the request had one."""

    def stack_key(self) -> tuple[int, tuple[object, ...]] | None:
        """Its rows and what requests sent with it as one must share (the names,
        datatypes and shapes past dimension 0 of its inputs and outputs), or None when
        its tensors do not all have the same rows."""
        rows = request_rows(self.inputs)
        if not rows or request_rows(self.serving) != rows:
            return None
        return rows, tuple(
            (name, datatype, array.shape[1:], array.dtype)
            for group in (self.inputs, self.serving)
            for name, (datatype, array) in sorted(group.items())
        )


def tensor_bytes(*groups: Outputs) -> int:
    return sum(array.nbytes for group in groups for _, array in group.values())


class _FailureLog:
    """At most one WARNING per interval summarising the failures since the last one."""

    def __init__(self, target: MirrorTarget, interval: float, clock: Callable[[], float]):
        self._target, self._interval, self._clock = target, interval, clock
        self._last: float | None = None
        self._counts: dict[str, int] = {}

    def failed(self, outcome: str, reason: str) -> None:
        log.debug("Mirrored request failed outcome=%s url=%s reason=%s",
                  outcome, self._target.url, reason)  # fmt: skip
        self._counts[outcome] = self._counts.get(outcome, 0) + 1
        now = self._clock()
        if self._last is None or now - self._last >= self._interval:
            counts = " ".join(f"{k}={v}" for k, v in sorted(self._counts.items()))
            log.warning(
                "Mirrored requests failed candidate_version=%s url=%s %s last_reason=%s",
                self._target.candidate_version, self._target.url, counts, reason,
            )  # fmt: skip
            self._last, self._counts = now, {}


class Mirror:
    """Mirrors sampled requests to one target; `start()` before `offer`, `close()` after.

    After `close()` nothing more is recorded: work in flight is cancelled and queued work
    discarded, as the candidate's figures no longer matter."""

    def __init__(
        self,
        target: MirrorTarget,
        aggregates: RunningAggregates,
        *,
        clock: Callable[[], float] = time.monotonic,
        log_interval_seconds: float = 60.0,
        gather_rows: int = 1,
        gather_seconds: float = 0.0,
    ) -> None:
        policy = target.policy
        self.target = target
        self._aggregates = aggregates
        self._sampler = Sampler(target.traffic_percent)
        self._url = f"{target.url}/v2/models/{target.model_name}/infer"
        self._timeout = policy.timeout_milliseconds / 1000
        self._max_queue = policy.max_queue_size
        self._max_bytes = policy.max_queued_bytes
        self._queue: asyncio.Queue[MirroredRequest] = asyncio.Queue()
        self._queued_bytes = 0
        self._workers: list[asyncio.Task[None]] = []
        self._session: aiohttp.ClientSession | None = None
        self._clock = clock
        self._failures = _FailureLog(target, log_interval_seconds, clock)
        self._closed = False
        self._unreachable_until: float | None = None
        self._backoff = _BACKOFF_SECONDS[0]
        self._gather_rows, self._gather_seconds = gather_rows, gather_seconds
        self._gathering = asyncio.Lock()  # one worker gathers at a time, the others send
        self._gathered: asyncio.Future[None] | None = None  # set: stop waiting for more
        self._gathered_rows = 0  # the rows of the gather waiting for more
        self._carried: MirroredRequest | None = None  # taken, but not of the last gather

    @property
    def queued(self) -> int:
        return self._queue.qsize()

    @property
    def queued_bytes(self) -> int:
        return self._queued_bytes

    async def start(self) -> None:
        concurrency = self.target.policy.max_concurrency
        # One session per target: its connections are reused from request to request.
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=concurrency),
            timeout=aiohttp.ClientTimeout(total=self._timeout),
        )
        self._workers = [
            asyncio.create_task(self._work(), name=f"kubeinfer-mirror-{i}")
            for i in range(concurrency)
        ]

    def offer(
        self,
        inputs: Outputs,
        serving: Outputs,
        serving_seconds: float,
        slice_value: str | None = None,
    ) -> None:
        """Samples one answered request and queues it if there is room (else `dropped`).
        Never blocks; the arrays are kept as they are (the caller does not reuse them)."""
        if self._closed or not self._sampler.take():
            return
        self.admit(inputs, serving, serving_seconds, slice_value)

    def admit(
        self,
        inputs: Outputs,
        serving: Outputs,
        serving_seconds: float,
        slice_value: str | None = None,
    ) -> None:
        """`offer` of a request sampled already (the Rust data plane samples each request
        itself, at the target's share): queued if there is room, else `dropped`."""
        if self._closed:
            return
        if self._unreachable():
            self._aggregates.record_outcome("candidate_error")  # not tried: see the module
            return
        nbytes = tensor_bytes(inputs, serving)
        if self._queue.qsize() >= self._max_queue or self._queued_bytes + nbytes > self._max_bytes:
            self._aggregates.record_outcome("dropped")
            return
        self._queued_bytes += nbytes
        self._queue.put_nowait(
            MirroredRequest(inputs, serving, serving_seconds, nbytes, slice_value)
        )
        if self._gathered is not None and self._enough_queued():
            _resolve(self._gathered)

    async def close(self) -> None:
        """Cancels the work in flight, discards the queue, closes the connections."""
        self._closed = True
        for worker in self._workers:
            worker.cancel()
        if self._workers:
            # A cancellation that lands as aiohttp's own timeout fires is turned into a
            # TimeoutError there; such a worker then sees `_closed` and ends on its own.
            # Bounded all the same: a stuck worker must not hold up a drain.
            await asyncio.wait(self._workers, timeout=_CLOSE_WAIT_SECONDS)
        self._workers = []
        while not self._queue.empty():
            self._queue.get_nowait()
        self._queued_bytes = 0
        self._carried = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _work(self) -> None:
        while not self._closed:
            batch = await self._next_batch()
            try:
                await self._mirror(batch)
            except asyncio.CancelledError:
                raise
            except Exception as error:  # a bug of ours must not kill the worker
                self._failed("candidate_error", f"{type(error).__name__}: {error}", len(batch))

    async def _take(self) -> MirroredRequest:
        request = await self._queue.get()
        self._queued_bytes -= request.nbytes
        return request

    def _enough_queued(self) -> bool:
        """Whether a gather stops waiting: with its first request's rows, a full batch is
        queued (each request has a row at least), or half of what the queue may hold (so
        gathering never makes the queue drop)."""
        queued = self._queue.qsize()
        return (
            self._gathered_rows + queued >= self._gather_rows
            or queued * 2 >= self._max_queue
            or self._queued_bytes * 2 >= self._max_bytes
        )

    async def _next_batch(self) -> list[MirroredRequest]:
        """The next requests to send as one: with `gather_rows` above 1, those queued
        within `gather_seconds` of the first (or until enough are queued) that stack with
        it, up to `gather_rows` rows in all; otherwise the next request alone."""
        if self._gather_rows <= 1:
            return [await self._take()]
        async with self._gathering:
            first, self._carried = self._carried or await self._take(), None
            stack = first.stack_key()
            if stack is None:
                return [first]
            rows, key = stack
            self._gathered_rows = rows
            if self._gather_seconds > 0 and not self._enough_queued():
                await self._wait_for_more()
            batch = [first]
            while rows < self._gather_rows and not self._queue.empty():
                request = self._queue.get_nowait()
                self._queued_bytes -= request.nbytes
                other = request.stack_key()
                if other is None or other[1] != key or rows + other[0] > self._gather_rows:
                    self._carried = request  # the first of the next gather
                    break
                batch.append(request)
                rows += other[0]
            return batch

    async def _wait_for_more(self) -> None:
        loop = asyncio.get_running_loop()
        self._gathered = gathered = loop.create_future()
        timer = loop.call_later(self._gather_seconds, _resolve, gathered)
        try:
            await gathered
        finally:
            timer.cancel()
            self._gathered = None

    def _failed(self, outcome: str, reason: str, requests: int = 1) -> None:
        if self._closed:
            return
        for _ in range(requests):
            self._aggregates.record_outcome(outcome)
        self._failures.failed(outcome, reason)

    def _unreachable(self) -> bool:
        """Whether a connection was refused so recently that no new attempt is made."""
        until = self._unreachable_until
        if until is None:
            return False
        if self._clock() < until:
            return True
        self._unreachable_until = None
        return False

    async def _mirror(self, batch: list[MirroredRequest]) -> None:
        """Sends the batch's requests as one (their input rows stacked) and compares each
        request's outputs with its rows of the answer."""
        count = len(batch)
        if self._unreachable():  # queued before the refusal
            self._failed("candidate_error", "refused a moment ago", count)
            return
        stacked = batch[0].inputs if count == 1 else stack_requests([r.inputs for r in batch])
        answered = await self._send(stacked, count)
        if answered is None:
            return
        payload, answer_header, timing, round_trip = answered
        try:
            length = int(answer_header) if answer_header is not None else None
            answer = decode_infer_response(payload, length)
        except ValueError as error:  # InvalidResponse, or a bad header length
            self._failed("candidate_error", f"unreadable answer: {error}", count)
            return
        candidate = {o.name: (o.datatype, o.data) for o in answer.outputs}
        aggregates = self._aggregates
        comparisons = compare_requests(
            [r.serving for r in batch], candidate,
            trusted=aggregates.trusted, per_row=aggregates.per_row,
        )  # fmt: skip
        if self._closed:
            return
        candidate_seconds = parse_server_timing(timing)
        for request, comparison in zip(batch, comparisons, strict=True):
            aggregates.record_comparison(
                comparison,
                request.serving_seconds,
                round_trip if candidate_seconds is None else candidate_seconds,
                slice_value=request.slice_value,
                inputs=request.inputs,
            )

    async def _send(
        self, stacked: Outputs, count: int
    ) -> tuple[bytes, str | None, str | None, float] | None:
        """Posts the stacked inputs (binary tensors, under the mirror's timeout); returns
        the 200 answer's body, binary header length and Server-Timing, and the round trip's
        seconds, or None when it failed (recorded for all `count` requests, a refused
        connection backing off)."""
        assert self._session is not None
        inputs = [InferInput(name, datatype, data) for name, (datatype, data) in
                  stacked.items()]  # fmt: skip
        body, header_length = encode_infer_request(
            inputs, timeout_microseconds=int(self._timeout * 1e6)
        )
        headers = {
            HEADER_LENGTH_HEADER: str(header_length),
            "Content-Type": "application/octet-stream",
        }
        started = self._clock()
        try:
            async with self._session.post(self._url, data=body, headers=headers) as response:
                payload = await response.read()
                status = response.status
                answer_header = response.headers.get(HEADER_LENGTH_HEADER)
                timing = response.headers.get(SERVER_TIMING_HEADER)
        except TimeoutError:
            self._failed("timeout", f"no answer within {self._timeout:g}s", count)
            return None
        except aiohttp.ClientConnectorError as error:  # refused, unresolvable, unreachable
            now = self._clock()
            if self._unreachable_until is None or now >= self._unreachable_until:
                self._unreachable_until = now + self._backoff  # several refused at once:
                self._backoff = min(self._backoff * 2, _BACKOFF_SECONDS[1])  # one window
            self._failed("candidate_error", f"{type(error).__name__}: {error}", count)
            return None
        except (aiohttp.ClientError, OSError) as error:
            self._failed("candidate_error", f"{type(error).__name__}: {error}", count)
            return None
        self._backoff = _BACKOFF_SECONDS[0]  # it answered: the next refusal starts over
        round_trip = self._clock() - started
        if status != 200:
            self._failed("candidate_error", f"HTTP {status}: {payload[:200]!r}", count)
            return None
        return payload, answer_header, timing, round_trip


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
