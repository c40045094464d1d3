"""Runners: how independent jobs run, on a thread pool or in turn, their results in order.
A writer's or reader's part threads run parts, side sections and the estimate's blocks
through one; nothing a Runner runs may depend on how many threads it has."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from typing import Protocol, TypeVar

T = TypeVar("T")


class Runner(Protocol):
    """Runs independent jobs (on a pool or in turn) and returns their results in order."""

    def __call__(self, jobs: Sequence[Callable[[], T]]) -> list[T]: ...


def in_turn(jobs: Sequence[Callable[[], T]]) -> list[T]:
    """A Runner without threads."""
    return [job() for job in jobs]


def on_pool(pool: Executor) -> Runner:
    """A Runner on `pool`. When jobs fail it raises the failure of the first one in order (the
    lowest-numbered part, SPEC.md 8.9), after cancelling the jobs not started. A job must not
    wait for other jobs of the same pool (it could wait for ever on a full pool)."""
    def run(jobs: Sequence[Callable[[], T]]) -> list[T]:
        futures: list[Future[T]] = [pool.submit(job) for job in jobs]
        try:
            return [f.result() for f in futures]
        finally:
            for f in futures:
                f.cancel()
    return run


__all__ = ["Runner", "in_turn", "on_pool"]
