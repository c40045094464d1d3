"""Runners: how independent jobs run, on a thread pool or in turn, their results in order.
A writer's or reader's part threads run parts, side sections and the estimate's blocks
through one; nothing a Runner runs may depend on how many threads it has."""
from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from functools import partial
from typing import Protocol, TypeVar

T = TypeVar("T")


class Runner(Protocol):
    """Runs independent jobs (on a pool or in turn) and returns their results in order."""

    def __call__(self, jobs: Sequence[Callable[[], T]]) -> list[T]: ...


def in_turn(jobs: Sequence[Callable[[], T]]) -> list[T]:
    """A Runner without threads."""
    return [job() for job in jobs]


_inside = threading.local()  # .pools: the ids of the pools whose job this thread is running


def on_pool(pool: Executor) -> Runner:
    """A Runner on `pool`. When jobs fail it raises the failure of the first one in order (the
    lowest-numbered part, SPEC.md 8.9), after cancelling the jobs not started. Called from a
    job of the same pool, it runs the jobs in turn: a job waiting for jobs queued behind it on
    a full pool would wait for ever."""
    def run(jobs: Sequence[Callable[[], T]]) -> list[T]:
        if id(pool) in getattr(_inside, "pools", ()):
            return in_turn(jobs)
        futures: list[Future[T]] = [pool.submit(partial(_as_job_of, id(pool), job)) for job in jobs]
        try:
            return [f.result() for f in futures]
        finally:
            for f in futures:
                f.cancel()
    return run


def _as_job_of(pool: int, job: Callable[[], T]) -> T:
    outer: frozenset[int] = getattr(_inside, "pools", frozenset())
    _inside.pools = outer | {pool}
    try:
        return job()
    finally:
        _inside.pools = outer


__all__ = ["Runner", "in_turn", "on_pool"]
