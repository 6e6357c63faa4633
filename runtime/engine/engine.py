"""The engine: requests queue, a step loop on its own thread over a worker, events back to asyncio consumers.

The engine never touches a tensor beyond handing logits to the sampler: the worker (or any `ModelRunner`,
runtime/worker/runner.py) does the model, and what else it does is what its capabilities state. Admission is
decided in `submit`, before a reply's first byte: a request that can never fit is a 400, a full queue a 429, a
draining engine a 503. With a prefix cache (a runner stating `snapshot`), an admitted prompt resumes from its
longest cached prefix, and states are offered to the cache at every `chunk` boundary and at the end of each
prompt and reply. With a runner stating `draft`, a decoding sequence drafts tokens and verifies them in one
step (runtime/engine/drafting.py), emitting exactly the tokens serial decoding would; states are offered only
after the rejected rows were rolled back.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

from tfc.runtime.engine.drafting import EngineDrafting, one_line
from tfc.runtime.engine.engine_seq import EngineConfig, EngineSeq, Stream, pusher
from tfc.runtime.engine.generate import token_sha
from tfc.runtime.engine.metrics import EngineMetrics
from tfc.runtime.engine.pick import pick, prompt_logprobs, step_draws
from tfc.runtime.engine.prefix_cache import open_prefix_cache
from tfc.runtime.engine.request import Event, Rejected, Request, Usage
from tfc.runtime.engine.request_check import check_request, reader_of
from tfc.runtime.engine.scheduler import Running, plan_step, upcoming_chunks
from tfc.runtime.worker.runner import ModelRunner, prefetch, snapshots_of
from tfc.runtime.worker.step import RowsUnavailable, SequenceStep


class Engine:
    """Continuous batching over one runner; `submit` from the event loop, the steps run on a thread."""

    def __init__(
        self, runner: ModelRunner, tokenizer: Any, config: EngineConfig, metrics: EngineMetrics | None = None
    ):
        self.runner, self.tokenizer, self.config = runner, tokenizer, config
        self.capabilities = runner.capabilities  # stated once: they hold for the runner's life
        self.metrics = metrics or EngineMetrics(model="model")
        self.info = runner.info
        slots = min(config.max_seqs, runner.capacity.slots)
        self._free = list(range(slots))[::-1]
        self._waiting: deque[EngineSeq] = deque()
        self._running: list[EngineSeq] = []
        self._lock = threading.Condition()
        self._stop = False
        self._halt_reason: str | None = None
        self.draining = False
        self.fatal: str | None = None
        self.steps = 0
        self.prefix, self.prefix_note = open_prefix_cache(runner, config.prefix, config.chunk, self.metrics)
        self.snapshots = snapshots_of(runner) if self.prefix is not None else None
        self.drafting = EngineDrafting(runner, config.draft, config.draft_off, self.metrics)
        self._thread = threading.Thread(target=self._loop, name="tfc-engine", daemon=True)

    @property
    def slots(self) -> int:
        """Sequences that run at once."""
        return min(self.config.max_seqs, self.runner.capacity.slots)

    def start(self) -> None:
        """Start the step loop."""
        self._thread.start()

    # -- the consumer side (event loop thread) -------------------------------------------------------------

    def check(self, request: Request) -> None:
        """Raise Rejected if this request can never run here (context) or cannot be queued now."""
        if self.fatal is not None:
            raise Rejected(
                503, f"the engine has stopped: {self.fatal}", "engine_dead", self.config.retry_after_s
            )
        if self.draining:
            raise Rejected(503, "server restarting: retry shortly", "server_restarting", 30)
        check_request(request, min(self.config.max_context, self.info.context), self.info.vocab_size)

    def submit(self, requests: Sequence[Request]) -> list[Stream]:
        """Queue requests (all or none); their streams. Raises Rejected before anything was queued."""
        for r in requests:
            self.check(r)
        loop = asyncio.get_running_loop()
        streams = []
        with self._lock:
            # a cancelled sequence's slot frees at the next step boundary, before anything queued is admitted
            leaving = sum(s.cancelled for s in self._running)
            queued = sum(not s.cancelled for s in self._waiting)
            if queued + len(requests) > self.config.max_waiting + len(self._free) + leaving:
                self.metrics.rejected.inc(len(requests))
                raise Rejected(
                    429, f"the server is at capacity ({len(self._running)} running, {len(self._waiting)} waiting)",
                    "rate_limit_exceeded", self.config.retry_after_s,
                )  # fmt: skip
            for r in requests:
                queue: asyncio.Queue = asyncio.Queue()
                reader = reader_of(r, self.tokenizer)
                seq = EngineSeq(r, reader, pusher(loop, queue))
                self._waiting.append(seq)
                streams.append(Stream(self, seq, queue))
            self.metrics.waiting.set(len(self._waiting))
            self._lock.notify()
        return streams

    def _cancel(self, seq: EngineSeq) -> None:
        with self._lock:
            seq.cancelled = True
            self._lock.notify()

    @property
    def inflight(self) -> int:
        """Requests queued or running."""
        with self._lock:
            return len(self._waiting) + len(self._running)

    def counts(self) -> tuple[int, int]:
        """(running, waiting)."""
        with self._lock:
            return len(self._running), len(self._waiting)

    def halt(self, reason: str) -> None:
        """End every queued and running request with an error event and stop the loop (at a step boundary)."""
        with self._lock:
            self._halt_reason = self._halt_reason or reason  # the first reason given is the one reported
            self._stop = True
            self._lock.notify()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the loop and wait for it."""
        self.halt("the server is shutting down")
        if self._thread.is_alive():
            self._thread.join(timeout)
        if not self._thread.is_alive():
            self._close_prefix()

    def _close_prefix(self) -> None:
        if self.prefix is not None:
            self.prefix.close()

    def prefix_stats(self) -> dict:
        """Whether the prefix cache is on (and why not), with its entries, hits and tiers when it is."""
        out: dict[str, Any] = {"on": self.prefix is not None, "note": self.prefix_note}
        if self.prefix is not None:
            out.update(self.prefix.stats())
        return out

    def draft_stats(self) -> dict:
        """Whether drafting is on (and why not), with the rounds, drafted and accepted tokens so far."""
        return self.drafting.stats()

    # -- the step loop (engine thread) ---------------------------------------------------------------------

    def _loop(self) -> None:
        try:
            while True:
                with self._lock:
                    while not self._stop and not self._waiting and not self._running:
                        self._lock.wait()
                    if self._stop:
                        break
                    self._reap()
                    admitted = self._admit()
                    work = list(self._running)
                # a prompt whose logprobs are asked is computed, not restored
                admitted = [s for s in admitted if s.request.prompt_logprobs is None]
                if admitted and self.prefix is not None:
                    self._resume(admitted)
                if work:
                    self._step(work)
        except Exception as error:  # the model failed: no request can finish any more
            self.fatal = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            self._halt_reason = f"the engine failed ({self.fatal})"
        with self._lock:
            for seq in [*self._running, *self._waiting]:
                self._end(seq, Event("", (), "error", self._halt_reason or "stopped"))
            self._running.clear()
            self._waiting.clear()
        self._close_prefix()

    def _reap(self) -> None:
        """Drop cancelled sequences (under the lock), freeing their slots."""
        for seq in [s for s in self._running if s.cancelled]:
            self._running.remove(seq)
            self._release(seq)
            self.metrics.aborted.inc()
        kept = deque(s for s in self._waiting if not s.cancelled)
        self.metrics.aborted.inc(len(self._waiting) - len(kept))
        self._waiting = kept
        self.metrics.running.set(len(self._running))
        self.metrics.waiting.set(len(self._waiting))

    def _admit(self) -> list[EngineSeq]:
        admitted = []
        while self._waiting and self._free:
            seq = self._waiting.popleft()
            drafting = self.drafting.drafter is not None and seq.request.draft
            every = seq.request.prompt_logprobs is not None
            seq.run = Running(self._free.pop(), seq.request.prompt, drafting=drafting, every=every)
            seq.started = time.monotonic()
            self._running.append(seq)
            admitted.append(seq)
            self.metrics.queue_time.observe(seq.started - seq.request.arrival)
        self.metrics.running.set(len(self._running))
        self.metrics.waiting.set(len(self._waiting))
        self.metrics.kv_usage.set(1 - len(self._free) / max(1, self.slots))
        return admitted

    def _resume(self, seqs: list[EngineSeq]) -> None:
        """Look every new prompt up first (each pins what it found), then restore each into its slot."""
        leases = [(seq, self.prefix.lease(seq.request.prompt)) for seq in seqs]
        try:
            for seq, lease in leases:
                seq.chain = lease.chain
                if lease.entry is not None:
                    seq.run.fed = seq.cached = self.prefix.resume(lease, seq.run.slot, self.snapshots)
        finally:
            for _, lease in leases:
                self.prefix.release(lease)

    def _offer(self, seq: EngineSeq, ended: bool) -> None:
        """Offer a sequence's state to the prefix cache at a chunk boundary, its prompt's end or its end (not
        past its prompt's end where the runner prefills on another path than it decodes: resumed == fresh)."""
        run, chain = seq.run, seq.chain
        if run.fed > len(run.prompt) and self.capabilities.prompt_rows:
            return
        chain.extend(run.fed_since(len(chain)))
        if ended or run.fed % self.config.chunk == 0 or run.fed == len(run.prompt):
            self.prefix.offer(chain, run.fed, run.slot, self.snapshots)

    def _release(self, seq: EngineSeq) -> None:
        if seq.run is not None:
            self.runner.release(seq.run.slot)
            self._free.append(seq.run.slot)
            seq.run = None

    def _step(self, work: list[EngineSeq]) -> None:
        by_slot = {s.run.slot: s for s in work}
        context = min(self.config.max_context, self.info.context)
        self.drafting.propose([(s.run, s.request) for s in work], context, self.config.draft_rows)
        plan = plan_step([s.run for s in work], self.config.chunk, self.config.budget(self.drafting.block))
        for row in plan.rows:  # masks of the rows that sample this step are computed while the model runs
            seq = by_slot[row.slot]
            if seq.request.constraint is not None and seq.run.fed + len(row.tokens) >= len(seq.run.prompt):
                seq.request.constraint.start()
        prefetch(
            self.runner,
            upcoming_chunks(plan, [by_slot[row.slot].run for row in plan.rows], self.config.chunk),
        )
        try:
            out = self.runner.execute(plan)
        except RowsUnavailable as error:  # nothing ran: those sequences fail, the others run again next step
            self._fail_rows(by_slot, error)
            return
        self.steps += 1
        self.metrics.iteration_tokens.observe(plan.tokens)
        now = time.monotonic()
        done: list[tuple[EngineSeq, Event, tuple[int, ...]]] = []
        step_logits = prompt_logprobs(plan, out.logits, by_slot)
        drawn = step_draws(plan, step_logits, by_slot)
        for row, logits in zip(plan.rows, step_logits, strict=True):
            seq = by_slot[row.slot]
            if row.verify:
                self._verify(seq, row, logits, now, done, drawn)
                continue
            seq.run.fed += len(row.tokens)
            if seq.run.prefilling:
                continue
            if seq.request.max_tokens == 0:  # a scored prompt: it ends generating nothing
                done.append((seq, Event("", (), "length", prompt_logprobs=tuple(seq.prompt_logprobs)), ()))
            else:
                self._next(seq, logits, now, done, drawn)
        if self.prefix is not None:  # after every rollback: a state is offered only with committed rows
            ended = {id(seq) for seq, _, _ in done}
            for row in plan.rows:
                seq = by_slot[row.slot]
                if seq.chain is not None:
                    self._offer(seq, id(seq) in ended)
        with self._lock:  # slots are free again before a client hears that its sequence ended
            for seq, _, _ in done:
                if seq in self._running:
                    self._running.remove(seq)
                self._release(seq)
            self.metrics.running.set(len(self._running))
            self.metrics.kv_usage.set(1 - len(self._free) / max(1, self.slots))
        for seq, last, tokens in done:
            self._end(seq, last, tokens)

    def _fail_rows(self, by_slot: dict[int, EngineSeq], error: RowsUnavailable) -> None:
        """End the sequences whose rows could not be read with the error (a 5xx); their slots are free again."""
        failed = [by_slot[slot] for slot in error.slots if slot in by_slot] or list(by_slot.values())
        tokens = [tuple(seq.run.generated) for seq in failed]
        with self._lock:
            for seq in failed:
                if seq in self._running:
                    self._running.remove(seq)
                self._release(seq)
            self.metrics.running.set(len(self._running))
        for seq, got in zip(failed, tokens, strict=True):
            self._end(seq, Event([] if seq.request.reader else "", (), "error", one_line(error)), got)

    def _verify(self, seq: EngineSeq, row: SequenceStep, logits: Any, now: float, done: list,
                drawn: dict[tuple[int, int], int]) -> None:  # fmt: skip
        """Sample the verify rows in order as serial decoding would; keep the drafts it agrees with, roll back."""
        run, draft = seq.run, row.tokens[1:]
        accepted = 0
        for i in range(len(row.tokens)):
            run.fed = row.position + i + 1
            before = len(run.generated)
            going = self._next(seq, logits[i], now, done, drawn)
            hit = i < len(draft) and len(run.generated) > before and run.generated[-1] == draft[i]
            accepted += hit
            if not going or not hit:
                break
        self.drafting.settle(run, seq.drafted, len(draft), accepted)

    def _next(self, seq: EngineSeq, logits: Any, now: float, done: list,
              drawn: dict[tuple[int, int], int]) -> bool:  # fmt: skip
        """Sample (or take from `drawn`) and emit the token at `run.fed`; False (and the sequence in `done`) when
        it ended."""
        run = seq.run
        try:
            token, logprob = pick(seq.request, logits, run.fed, drawn.get((run.slot, run.fed)), run)
        except Exception as error:  # a request's constraint failed: end that request, not the engine
            done.append((seq, Event([] if seq.request.reader else "", (), "error", one_line(error)), ()))
            return False
        run.generated.append(token)
        if seq.first_token is None:
            seq.first_token = now
            self.metrics.ttft.observe(now - seq.request.arrival)
        else:
            self.metrics.itl.observe(now - seq.last_token)
        seq.last_token = now
        try:
            last = self._emit(seq, token, logprob)
        except Exception as error:  # a request's reader failed: end that request, not the engine
            last = Event([] if seq.request.reader else "", (token,), "error", one_line(error))
        if last is None:
            return True
        done.append((seq, last, tuple(run.generated)))
        return False

    def _emit(self, seq: EngineSeq, token: int, logprob: tuple = ()) -> Event | None:
        """Push the new token's text, or return the last event when the sequence finished."""
        r, run = seq.request, seq.run
        context = min(self.config.max_context, self.info.context)
        if token in r.stop_ids:
            text, finish = seq.stops.flush(), "stop"
        else:
            text, hit = seq.stops.add(token)
            finish = "stop" if hit else None
            if finish is None and (len(run.generated) >= r.max_tokens or run.fed + 1 >= context):
                text, finish = text + seq.stops.flush(cut=True), "length"
        self.metrics.generation_tokens.inc()
        prompt_lp, seq.prompt_logprobs = tuple(seq.prompt_logprobs), []  # on the first event only
        if finish is None:
            seq.push(Event(text, (token,), logprobs=logprob, prompt_logprobs=prompt_lp))
            return None
        return Event(text, (token,), finish, logprobs=logprob, prompt_logprobs=prompt_lp)

    def _end(self, seq: EngineSeq, event: Event, tokens: tuple[int, ...] | None = None) -> None:
        """Send the last event with the sequence's totals; count it."""
        r = seq.request
        if tokens is None:
            tokens = tuple(seq.run.generated) if seq.run is not None else ()
        now = time.monotonic()
        usage = Usage(
            len(r.prompt), len(tokens), (seq.first_token or now) - r.arrival, now - r.arrival,
            (seq.started or now) - r.arrival, seq.cached, **seq.drafted.as_dict(),
        )  # fmt: skip
        self.metrics.finish(event.finish, usage)  # counted before the client hears its request ended
        seq.push(Event(event.text, event.token_ids, event.finish, event.error, tokens, usage, event.logprobs,
                       event.prompt_logprobs))  # fmt: skip


__all__ = ["Engine", "EngineConfig", "Stream", "token_sha"]
