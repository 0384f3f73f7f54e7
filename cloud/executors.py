"""Where the pipeline's parallel work runs: in this process, in worker processes on this machine (the
build's default), or on a Ray cluster.

Each maps a plain function `function(context, item)` over items; the context (a trained supernet and
data arrays) is shipped to the workers once, not once per item.
"""

from __future__ import annotations

import multiprocessing
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any, TypeVar

from fedzoo.edge.device_profile import usable_cores
from fedzoo.errors import FedzooError, InvalidInputError

Context = TypeVar("Context")
Item = TypeVar("Item")
Result = TypeVar("Result")


class ExecutorUnavailableError(FedzooError):
    """The chosen executor cannot run here (e.g. Ray is not installed)."""


class Executor(ABC):
    """Runs independent work items and returns their results in item order."""

    name: str
    workers: int = 1  # items it runs at once

    @abstractmethod
    def map(
        self,
        function: Callable[[Context, Item], Result],
        context: Context,
        items: Sequence[Item],
        on_result: Callable[[int], None] | None = None,
    ) -> list[Result]:
        """`[function(context, item) for item in items]`, calling `on_result(done_count)` as items finish."""

    def close(self) -> None:
        """Release workers; the executor must not be used afterwards."""

    def worker_pids(self) -> list[int]:
        """The process ids of its workers on this machine (none when it runs items in this process or on Ray)."""
        return []


class InProcessExecutor(Executor):
    """One item after another in this process."""

    name = "in-process"

    def map(self, function, context, items, on_result=None):
        results = []
        for item in items:
            results.append(function(context, item))
            if on_result is not None:
                on_result(len(results))
        return results


_worker_context: Any = None  # a ProcessExecutor worker's copy of the context, set once when it starts


def _receive_context(context: Any) -> None:
    global _worker_context
    _worker_context = context


def _call_with_worker_context(function: Callable[[Any, Any], Any], item: Any) -> Any:
    return function(_worker_context, item)


class ProcessExecutor(Executor):
    """Items spread over `num_workers` spawned processes on this machine (inline when it is 1).

    The pool lives across maps with the same context, so the search's generations pay for starting the
    workers and copying the supernet once. Functions must be importable (module level), as for Ray."""

    name = "processes"

    def __init__(self, num_workers: int) -> None:
        self.num_workers = self.workers = num_workers
        self._pool: ProcessPoolExecutor | None = None
        self._context: Any = None

    def _pool_for(self, context: Any) -> ProcessPoolExecutor:
        if self._pool is None or context is not self._context:
            self.close()
            # spawned, not forked: a forked child of a process that has run torch's thread pool can hang
            self._pool = ProcessPoolExecutor(self.num_workers, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_receive_context, initargs=(context,))  # fmt: skip
            self._context = context
        return self._pool

    def map(self, function, context, items, on_result=None):
        if self.num_workers == 1:
            return InProcessExecutor().map(function, context, items, on_result)
        pool = self._pool_for(context)
        futures = {pool.submit(_call_with_worker_context, function, item): index for index, item in enumerate(items)}
        results: list[Any] = [None] * len(futures)
        for done, future in enumerate(as_completed(futures), start=1):
            results[futures[future]] = future.result()
            if on_result is not None:
                on_result(done)
        return results

    def worker_pids(self) -> list[int]:
        return list(self._pool._processes) if self._pool is not None else []  # noqa: SLF001 (no public accessor)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool, self._context = None, None


class RayExecutor(Executor):
    """Items as Ray tasks of one CPU each; starts a local Ray instance unless one is already running
    (connect to a cluster by starting Ray with `address=` before building). The context goes into Ray's
    object store once per context (not once per map, nor per item): every task reads that copy."""

    name = "ray"

    def __init__(self, num_cpus: int | None = None) -> None:
        try:
            import ray
        except ModuleNotFoundError:
            raise ExecutorUnavailableError(
                "the ray executor needs Ray, which is not installed: pip install 'fedzoo[ray]' (or use --executor in-process)"
            ) from None
        self._ray = ray
        self._started_here = not ray.is_initialized()
        if self._started_here:
            ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
        self.workers = int(ray.cluster_resources().get("CPU", 1))
        self._remote_functions: dict[Callable, Any] = {}
        self._context: Any = None
        self._context_reference: Any = None

    def map(self, function, context, items, on_result=None):
        ray = self._ray
        if function not in self._remote_functions:
            self._remote_functions[function] = ray.remote(num_cpus=1)(function)
        remote = self._remote_functions[function]
        if context is not self._context:  # one copy in the object store for every map with this context
            self._context, self._context_reference = context, ray.put(context)
        context_reference = self._context_reference
        pending = [remote.remote(context_reference, item) for item in items]
        order = {reference: index for index, reference in enumerate(pending)}
        results: list[Any] = [None] * len(pending)
        done = 0
        while pending:
            finished, pending = ray.wait(pending, num_returns=1)
            for reference in finished:
                results[order[reference]] = ray.get(reference)
                done += 1
                if on_result is not None:
                    on_result(done)
        return results

    def close(self) -> None:
        if self._started_here and self._ray.is_initialized():
            self._ray.shutdown()


EXECUTORS: dict[str, Callable[..., Executor]] = {"in-process": InProcessExecutor, "processes": ProcessExecutor, "ray": RayExecutor}


def make_executor(name: str, num_workers: int | None = None) -> Executor:
    """The executor registered under `name`; `num_workers` is the CPU count it may use (None: Ray's
    default, all usable cores for processes)."""
    if name not in EXECUTORS:
        raise InvalidInputError(f"unknown executor {name!r}; use one of {sorted(EXECUTORS)}", field="executor")
    if name == "ray":
        return RayExecutor(num_cpus=num_workers)
    if name == "processes":
        return ProcessExecutor(num_workers or usable_cores())
    return InProcessExecutor()
