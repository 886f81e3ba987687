"""The server's generation engine: one thread that owns the model and batches requests from every client.

HTTP handlers `submit` a `Job` (prompt ids, the adapter, sampling settings, stop strings, `n`) and await it.
The engine thread takes every job waiting (and keeps taking them while each arrives within `window_s` of the
last, so clients that send at nearly the same moment share a batch), groups them by adapter and sampling
settings, and runs each group through `HFPolicy.generate_rows`, the same decode loop, prefix cache and
stopping rules `agentrig eval` uses. Batching is continuous: a job with the same adapter and settings that
arrives while a batch runs joins it before the next token (`HFPolicy._decode`'s `admit`), and each job's
reply goes back as soon as its own rows end, not when the batch does. Each
generated token reaches the job's `on_text` callback (the text so far), which streams it; a stop string or a
cancelled job (a client that went away) ends that row at once and frees its place in the batch.

A job with a `seed` and sampling runs in a batch of its own, seeded exactly, so the same request gives the
same reply whatever else was in flight. Loading and unloading adapters run on the same thread between
batches (`control`), so a request never sees an adapter half-loaded. An exception while generating fails
the jobs of that batch only; the thread goes on serving.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable

from agentrig.policies.hf_policy import BASE


@dataclass
class Job:
    """One chat completion: `n` rows generated from the same prompt."""

    prompt: list[int]
    adapter: str
    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    n: int = 1
    on_text: Callable[[int, str], None] | None = None  # (row, text so far), from the engine thread
    cancelled: threading.Event = field(default_factory=threading.Event)
    future: Future = field(default_factory=Future)
    submitted: float = field(default_factory=time.perf_counter)

    def group(self) -> tuple[Any, ...]:
        """Jobs with the same key can share a batch."""
        seeded = self.seed if self.temperature > 0 else None
        unique = id(self) if seeded is not None else None
        return (self.adapter, self.temperature, self.top_p if self.temperature > 0 else 1.0, unique)


@dataclass
class Completion:
    """One generated row: its text (cut at a stop string), its token count and why it ended."""

    text: str
    completion_tokens: int
    finish_reason: str  # "stop" (end of turn or a stop string) | "length"
    stop_reason: str | None = None  # the stop string that ended it, as vLLM reports (None: end of turn or length)


class Engine:
    """Batches jobs from many clients onto one `HFPolicy` (see the module docstring)."""

    def __init__(self, policy: Any, *, max_batch: int = 16, window_s: float = 0.005) -> None:
        self.policy = policy
        self.max_batch = max_batch
        self.window_s = window_s
        self._queue: queue.Queue = queue.Queue()
        self._ids = itertools.count()
        self._thread = threading.Thread(target=self._loop, name="agentrig-serve-engine", daemon=True)
        self._stopping = False
        self._stash: list[tuple[str, Any]] = []  # taken from the queue during a batch, for the next one
        self.batches = 0  # batches run so far (tests read it to see that clients were batched together)
        self.largest_batch = 0
        self._thread.start()

    @property
    def adapters(self) -> list[str]:
        """The adapters loaded now."""
        return list(self.policy.adapter_names)

    def submit(self, job: Job) -> Future:
        """Queue a job; its future gets a list of `Completion`s (one per row) or the exception that failed it."""
        self._queue.put(("job", job))
        return job.future

    def control(self, fn: Callable[[], Any]) -> Future:
        """Run `fn` on the engine thread between batches (adapter loading); the future gets its result."""
        fut: Future = Future()
        self._queue.put(("control", (fn, fut)))
        return fut

    def close(self) -> None:
        """Stop the thread after the batch it is running."""
        self._stopping = True
        self._queue.put(("stop", None))
        self._thread.join(timeout=30)

    # -- the thread ---------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stopping:
            items = self._gather()
            jobs: list[Job] = []
            for kind, item in items:
                if kind == "stop":
                    self._stopping = True
                elif kind == "control":
                    self._run_jobs(jobs)  # jobs that came first are served before the adapters change
                    jobs = []
                    fn, fut = item
                    try:
                        fut.set_result(fn())
                    except Exception as exc:  # noqa: BLE001 - reported to the caller
                        fut.set_exception(exc)
                elif not item.cancelled.is_set():
                    jobs.append(item)
                else:
                    item.future.set_result([])
            self._run_jobs(jobs)
        while True:  # fail whatever is left so no handler waits forever
            try:
                kind, item = self._queue.get_nowait()
            except queue.Empty:
                return
            fut = item.future if kind == "job" else item[1] if kind == "control" else None
            if fut is not None and not fut.done():
                fut.set_exception(RuntimeError("the server is shutting down"))

    def _gather(self) -> list[tuple[str, Any]]:
        """Wait for the next item, then keep taking items while they keep coming: each one arriving within
        `window_s` of the last (clients whose previous replies came back together send their next requests a
        few milliseconds apart, each rendered in turn), up to `max_batch` jobs or `20 * window_s` in all."""
        if self._stash:  # items taken during the last batch that could not join it
            items, self._stash = self._stash, []
            while True:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    return items
        items = [self._queue.get()]
        if items[0][0] != "job" or self.window_s <= 0:
            return items
        deadline = time.perf_counter() + 20 * self.window_s
        jobs = 1
        while jobs < self.max_batch:
            wait = min(self.window_s, deadline - time.perf_counter())
            if wait <= 0:
                break
            try:
                item = self._queue.get(timeout=wait)
            except queue.Empty:
                break
            items.append(item)
            jobs += item[0] == "job"
        while True:  # whatever is already waiting goes too
            try:
                items.append(self._queue.get_nowait())
            except queue.Empty:
                return items

    def _run_jobs(self, jobs: list[Job]) -> None:
        groups: dict[tuple[Any, ...], list[Job]] = {}
        for job in jobs:
            groups.setdefault(job.group(), []).append(job)
        for members in groups.values():
            batch: list[tuple[Job, int]] = []
            for job in members:  # a job's rows stay in one batch
                if batch and len(batch) + job.n > self.max_batch:
                    self._run_batch(batch)
                    batch = []
                batch.extend((job, r) for r in range(job.n))
            if batch:
                self._run_batch(batch)

    def _run_batch(self, rows: list[tuple[Job, int]]) -> None:
        """Generate for these rows; compatible jobs that arrive meanwhile join the running batch (`_admit`), and
        each job's future is set as soon as its last row ends, not when the whole batch does."""
        first = rows[0][0]
        adapter = first.adapter if first.adapter in self.policy.adapter_names else BASE
        group = first.group()
        max_new = max(job.max_new_tokens for job, _ in rows)
        tokens: list[list[int]] = [[] for _ in rows]
        cut: list[str | None] = [None] * len(rows)
        ended_by_stop: list[str | None] = [None] * len(rows)
        results: dict[int, list[Completion | None]] = {}
        blocked = [False]  # a control item is waiting: admit nothing more, it runs after this batch
        finished = [0]

        def on_token(i: int, token: int) -> bool:
            job, r = rows[i]
            tokens[i].append(token)
            if job.cancelled.is_set():
                return True
            if len(tokens[i]) >= job.max_new_tokens and not self.policy.finished(tokens[i]):
                text, _ = self.policy.reply_text(tokens[i])
                cut[i], ended_by_stop[i] = self._cut(text, job.stop)
                return True
            if job.stop or job.on_text is not None:
                text, _ = self.policy.reply_text(tokens[i])
                if job.stop:
                    stopped, which = self._cut(text, job.stop)
                    if stopped is not None:
                        cut[i], ended_by_stop[i] = stopped, which
                        if job.on_text is not None:
                            job.on_text(r, stopped)
                        return True
                if job.on_text is not None:
                    job.on_text(r, text)
            return False

        def on_done(i: int) -> None:
            job, r = rows[i]
            text, used = self.policy.reply_text(tokens[i])
            which = ended_by_stop[i]
            if cut[i] is not None:
                text = cut[i]
            elif job.stop:
                stopped, which = self._cut(text, job.stop)
                text = text if stopped is None else stopped
            reason = "stop" if self.policy.finished(tokens[i]) or which is not None else "length"
            finished[0] += 1
            done = results.setdefault(id(job), [None] * job.n)
            done[r] = Completion(text, used, reason, which)
            if all(c is not None for c in done) and not job.future.done():
                job.future.set_result(done)

        def admit(free: int) -> list[tuple[list[int], tuple[str, str]]]:
            new: list[tuple[list[int], tuple[str, str]]] = []
            while not blocked[0] and free > 0:
                try:
                    kind, item = self._queue.get_nowait()
                except queue.Empty:
                    break
                fits = (kind == "job" and item.group() == group and item.n <= free
                        and item.max_new_tokens <= max_new and not item.cancelled.is_set())
                if not fits:
                    self._stash.append((kind, item))
                    blocked[0] = kind != "job"
                    continue
                for r in range(item.n):
                    rows.append((item, r))
                    tokens.append([])
                    cut.append(None)
                    ended_by_stop.append(None)
                    new.append((item.prompt, (f"serve-{next(self._ids)}", adapter)))
                free -= item.n
            self.largest_batch = max(self.largest_batch, len(rows) - finished[0])  # rows decoding together
            return new

        # A seeded job's group is its own (`Job.group`), so nothing joins its batch and its sampling stays exact.
        keys = [(f"serve-{next(self._ids)}", adapter) for _ in rows]
        self.largest_batch = max(self.largest_batch, len(rows))
        try:
            self.policy.generate_rows([job.prompt for job, _ in rows], adapter, keys, max_new_tokens=max_new,
                                      temperature=first.temperature, top_p=first.top_p, seed=first.seed,
                                      on_token=on_token, admit=admit, on_done=on_done)
        except Exception as exc:  # noqa: BLE001 - the jobs of this batch fail, the engine keeps serving
            for job in {id(j): j for j, _ in rows}.values():
                if not job.future.done():
                    job.future.set_exception(exc)
            return
        self.batches += 1
        for i, (job, _) in enumerate(rows):  # rows the decode loop did not report (none expected)
            if not job.future.done():
                on_done(i)

    @staticmethod
    def _cut(text: str, stops: list[str]) -> tuple[str | None, str | None]:
        """The text before the first stop string and that string, or (None, None) when none occurs."""
        found = sorted((text.find(s), s) for s in stops if s in text)
        return (text[: found[0][0]], found[0][1]) if found else (None, None)
