"""Where the coordinator's heavy, independent tasks run: here, a local process pool, or Dask.

The blocked graph's work splits into independent tasks (batches of influence columns to push,
chunks of candidate pairs to measure): `map_shared(fn, shared, items)` runs fn(shared, item) for
every item and returns the results in order. `shared` (the graph, the bit codes) is sent once per
worker, not once per task.

- "serial": in this process (small jobs, where starting workers costs more than it saves).
- "process" (default for large jobs): `concurrent.futures.ProcessPoolExecutor`, spawn start
  method (a forked child of a process that has loaded torch/OpenMP can deadlock). `shared` rides
  in the initializer, so each worker unpickles it once.
- "dask": `distributed.Client` on a scheduler address (a cluster of coordinator machines), or a
  given Client (tests use a `LocalCluster`). `shared` is scattered with broadcast=True and the
  tasks take it as a future. Optional dependency: `pip install "xclp[scale]"`.

Why Dask and not Ray: the tasks are plain functions over numpy/scipy objects, which is what
`distributed` schedules natively (futures, scatter, the same `map` shape as concurrent.futures);
it is pure Python on top of tornado, installs as one small wheel set, runs in-process for tests
(LocalCluster(processes=False)), and the scientific-Python stack the core already uses is its home.
Ray brings its own object store, a large native wheel and a separate runtime, for actor and
GPU-scheduling features this work does not use.

No scheduler is written here: each mode is the library's own.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor

_SHARED = None  # a pool worker's copy of `shared` (set once by the initializer)


def _init_worker(shared) -> None:
    global _SHARED
    _SHARED = shared
    # Each worker runs one task at a time: BLAS on one thread, so workers do not oversubscribe the cores.
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)


def _call_with_shared(fn, item):
    return fn(_SHARED, item)


class Executor:
    """map_shared(fn, shared, items) → [fn(shared, item) for item in items], somewhere."""

    kind = "serial"
    workers = 1  # tasks that run at once (a step splits its work into about this many when it can)

    def map_shared(self, fn, shared, items) -> list:
        return [fn(shared, item) for item in items]

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class ProcessExecutor(Executor):
    """A fresh spawn-started pool per map (its workers hold that call's `shared`)."""

    kind = "process"

    def __init__(self, workers: int | None = None):
        self.workers = workers or min(4, os.cpu_count() or 1)

    def map_shared(self, fn, shared, items) -> list:
        items = list(items)
        if len(items) <= 1:
            return [fn(shared, item) for item in items]
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=min(self.workers, len(items)), mp_context=ctx,
                                 initializer=_init_worker, initargs=(shared,)) as pool:
            return list(pool.map(_call_with_shared, [fn] * len(items), items))


class DaskExecutor(Executor):
    """Tasks on a Dask cluster: `client` (a distributed.Client) or `address` of a scheduler."""

    kind = "dask"

    def __init__(self, client=None, address: str | None = None):
        if client is None:
            try:
                from distributed import Client
            except ImportError as exc:  # pragma: no cover - depends on the extra
                raise ImportError('the dask executor needs the scale extra: pip install "xclp[scale]"') from exc
            client = Client(address)
            self._own = True
        else:
            self._own = False
        self.client = client

    @property
    def workers(self) -> int:
        return max(1, sum(self.client.nthreads().values()))

    def map_shared(self, fn, shared, items) -> list:
        items = list(items)
        if not items:
            return []
        [shared_future] = self.client.scatter([shared], broadcast=True)
        futures = [self.client.submit(fn, shared_future, item, pure=False) for item in items]
        return self.client.gather(futures)

    def close(self) -> None:
        if self._own:
            self.client.close()


def make_executor(kind: str = "process", workers: int | None = None, address: str | None = None,
                  client=None) -> Executor:
    if kind == "serial":
        return Executor()
    if kind == "process":
        return ProcessExecutor(workers)
    if kind == "dask":
        return DaskExecutor(client=client, address=address)
    raise ValueError(f"unknown executor {kind!r}; use serial, process or dask")
