"""A fixed set of model threads; requests wait in one bounded queue in front of them.

Each thread is a slot (`Job.slot`) with its own generator: an in-process generator keeps a
per-question KV cache and is not thread-safe, so it gets one slot and every model call runs on
that thread in arrival order; a served model (a batching server such as vLLM) gets several, so
several RIG loops run at once and the server batches their calls. Jobs start in arrival order.
Beyond `max_queue` waiting jobs, with every slot busy, a request is refused at once (the HTTP layer answers 429 with `Retry-After`) instead of waiting without
bound. A cancelled job leaves the queue (its slot is free at once) or, when already running, is
told through `job.cancelled`, which the run's `TokenStream` checks between tokens and rounds.
`close()` refuses new jobs, finishes every accepted one, then stops the thread: nothing accepted
is lost. `stop()` is for a server past its drain deadline: it cancels what is left.
"""

from __future__ import annotations

import contextvars
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from rigkit.streaming import Cancelled

__all__ = ["ModelWorker", "Job", "Busy", "Draining", "CancelledJob"]


class Busy(Exception):
    """The queue is full; try again after `retry_after` seconds."""

    def __init__(self, retry_after: int):
        super().__init__(f"the server is busy; retry after {retry_after} s")
        self.retry_after = retry_after


class Draining(Exception):
    """The server is shutting down and takes no new requests."""


@dataclass(eq=False)
class Job:
    """One unit of model work; `fn(job)` runs on a worker thread, whose index is `slot`, in the
    context it was queued from (its `contextvars`: the request it serves)."""

    fn: Callable[[Job], Any]
    slot: int | None = None
    future: Future = field(default_factory=Future)
    cancelled: threading.Event = field(default_factory=threading.Event)
    queued_at: float = field(default_factory=time.perf_counter)
    context: contextvars.Context = field(default_factory=contextvars.copy_context)


class ModelWorker:
    """`workers` threads taking `Job`s from one bounded FIFO queue."""

    def __init__(self, max_queue: int = 8, workers: int = 1):
        if max_queue < 0:
            raise ValueError("max_queue must be >= 0")
        if workers < 1:
            raise ValueError("workers must be >= 1")
        self.max_queue, self.workers = max_queue, workers
        self._queue: deque[Job] = deque()
        self._cv = threading.Condition()
        self._running: set[Job] = set()
        self._draining = False
        self._mean_seconds = 2.0  # running mean of job times, for Retry-After
        self.completed = 0  # jobs run to an outcome (a result or an error)
        self.cancelled = 0  # jobs stopped because their client went away
        self._threads = [threading.Thread(target=self._loop, args=(slot,), name=f"rigkit-model-{slot}", daemon=True)
                         for slot in range(workers)]
        for thread in self._threads:
            thread.start()

    # -- the request side ----------------------------------------------------------------------
    def submit(self, fn: Callable[[Job], Any]) -> Job:
        """Queue `fn`; raises `Busy` beyond the bound and `Draining` after `close()`."""
        with self._cv:
            if self._draining:
                raise Draining("the server is shutting down")
            if len(self._queue) >= self.max_queue and len(self._running) >= self.workers:
                raise Busy(self.retry_after())
            job = Job(fn)
            self._queue.append(job)
            self._cv.notify_all()
            return job

    def cancel(self, job: Job) -> None:
        """The client went away: free its queue slot, or stop its generation."""
        job.cancelled.set()
        with self._cv:
            if job in self._queue:
                self._queue.remove(job)
                self.cancelled += 1
                job.future.set_exception(CancelledJob("cancelled before it started"))

    def retry_after(self) -> int:
        """Seconds until a slot is likely free: the waiting jobs, shared by the slots, at the
        mean job time."""
        rounds = math.ceil((len(self._queue) + 1) / self.workers)
        return max(1, math.ceil(self._mean_seconds * rounds))

    @property
    def depth(self) -> int:
        """Jobs waiting plus those running."""
        with self._cv:
            return len(self._queue) + len(self._running)

    @property
    def running(self) -> int:
        """Jobs running now (at most `workers`)."""
        with self._cv:
            return len(self._running)

    @property
    def draining(self) -> bool:
        return self._draining

    def drain(self) -> None:
        """Refuse new jobs from now on; the accepted ones still run."""
        with self._cv:
            self._draining = True
            self._cv.notify_all()

    def close(self, timeout: float | None = None) -> None:
        """Refuse new jobs, finish the accepted ones, stop the threads."""
        with self._cv:
            self._draining = True
            self._cv.notify_all()
        self._join(timeout)

    def stop(self, timeout: float = 5.0) -> None:
        """Refuse new jobs and cancel every accepted one (their clients are gone: the server's
        drain deadline has passed or their connections closed), then stop the threads."""
        with self._cv:
            self._draining = True
            waiting, running = list(self._queue), list(self._running)
            self._cv.notify_all()  # idle threads wake and end
        for job in waiting + running:
            self.cancel(job)  # a running one stops at its next token or round
        self._join(timeout)

    def _join(self, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in self._threads:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))

    # -- the worker side -----------------------------------------------------------------------
    def _loop(self, slot: int) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._draining:
                    self._cv.wait()
                if not self._queue:  # draining and nothing left
                    return
                job = self._queue.popleft()
                job.slot = slot
                self._running.add(job)
            started = time.perf_counter()
            try:
                if job.cancelled.is_set():
                    raise Cancelled("cancelled before it started")
                result = job.context.run(job.fn, job)
            except BaseException as err:  # noqa: BLE001 - every job gets exactly one outcome
                if isinstance(err, Cancelled):
                    with self._cv:
                        self.cancelled += 1
                if not job.future.done():
                    job.future.set_exception(err if isinstance(err, Exception) else _as_exception(err))
            else:
                if not job.future.done():
                    job.future.set_result(result)
            finally:
                elapsed = time.perf_counter() - started
                with self._cv:
                    self._running.discard(job)
                    self.completed += 1
                    self._mean_seconds = 0.8 * self._mean_seconds + 0.2 * elapsed


class CancelledJob(Exception):
    """A job stopped by `Cancelled` (a BaseException), carried to the awaiting request."""


def _as_exception(err: BaseException) -> Exception:
    wrapped = CancelledJob(str(err) or type(err).__name__)
    wrapped.__cause__ = err
    return wrapped
