"""Merges concurrent predict requests into model batches (TF Serving's `--enable_batching`).

A request is a dict of input name -> numpy array whose first dimension is its examples. The
batcher queues requests, and whenever a model worker is free it takes the oldest request and
every later one with the same batch key (signature and the input shapes past the batch
dimension) while the merged batch stays within `max_batch_size` examples, waiting at most
`batch_timeout` seconds after the oldest request arrived for more to come (TF Serving's
`max_batch_size` and `batch_timeout_micros`) while another batch is running; when every
worker is idle it runs what is queued at once, since waiting would only add latency. The
merged inputs are concatenated along the first dimension, the model runs once in a worker
thread, and its outputs are split back into each request's rows. A request whose client has
gone before its batch starts is dropped (its future is cancelled), so no model work is done
for it.
"""

import asyncio
import collections

import numpy as np

_Pending = collections.namedtuple(
    "_Pending", ["key", "inputs", "size", "future", "arrived", "mergeable"])


class QueueFullError(Exception):
    """More examples are waiting than `max_queued_examples`: the server is overloaded."""


class RequestBatcher:
    """Runs `run(key, inputs)` on merged requests in a bounded pool of worker threads.

    Args:
        run: callable `(key, inputs) -> dict of output name -> numpy array`, every output with
            the merged batch as first dimension. Called in a worker thread.
        executor: `concurrent.futures.Executor` running `run`; its size is the number of
            batches in flight (`workers`).
        workers: int, batches run at once (the executor's threads).
        max_batch_size: int, most examples in one merged batch; `0` disables merging (every
            request runs alone).
        batch_timeout: float, seconds the oldest queued request waits for others to join
            while a batch is running (none when every worker is idle).
        max_queued_examples: int, most examples waiting; more raise `QueueFullError`.

    Example:
    >>> import concurrent.futures
    >>> def run(key, inputs):
    ...     return {"double": inputs["x"] * 2}
    >>> async def main():
    ...     batcher = RequestBatcher(run, concurrent.futures.ThreadPoolExecutor(1), workers=1,
    ...                              max_batch_size=8, batch_timeout=0.01)
    ...     answers = await asyncio.gather(*(batcher.submit("k", {"x": np.array([i, i + 1])})
    ...                                      for i in (0, 10)))
    ...     return [a["double"].tolist() for a in answers], batcher.batches_run
    >>> asyncio.run(main())
    ([[0, 2], [20, 22]], 1)
    """

    def __init__(self, run, executor, workers, max_batch_size, batch_timeout,
                 max_queued_examples=4096):
        self.run = run
        self.executor = executor
        self.max_batch_size = max_batch_size
        self.batch_timeout = batch_timeout
        self.max_queued_examples = max_queued_examples
        self.batches_run = 0
        self._queue = collections.deque()
        self._queued_examples = 0
        self._workers = workers
        self._running = 0  # batches in the workers
        self._arrived = None  # asyncio.Event, made on the event loop at first use
        self._dispatcher = None

    async def submit(self, key, inputs, mergeable=True):
        """The outputs of `inputs` (this request's rows only). Requests of equal `key` may be
        merged; a request with `mergeable=False` runs alone and gets the outputs whole.
        Cancelling the awaiting task before the batch starts takes the request out of the
        queue."""
        size = len(next(iter(inputs.values()))) if inputs else 1
        if self._queued_examples + size > self.max_queued_examples:
            raise QueueFullError(f"{self._queued_examples} examples are already waiting (at "
                                 f"most {self.max_queued_examples}, --max-queued-examples)")
        loop = asyncio.get_running_loop()
        if self._dispatcher is None:
            self._arrived = asyncio.Event()
            self._slots = asyncio.Semaphore(self._workers)
            self._dispatcher = loop.create_task(self._dispatch())
        future = loop.create_future()
        self._queue.append(_Pending(key, inputs, size, future, loop.time(), mergeable))
        self._queued_examples += size
        self._arrived.set()
        return await future

    async def close(self):
        if self._dispatcher is not None:
            self._dispatcher.cancel()
            await asyncio.gather(self._dispatcher, return_exceptions=True)

    async def _dispatch(self):
        loop = asyncio.get_running_loop()
        while True:
            await self._slots.acquire()
            while not self._live_head():
                self._arrived.clear()
                await self._arrived.wait()
            # With every worker idle nothing is gained by waiting: run what is there now.
            # Otherwise wait for the batch to fill, at most until the oldest one's deadline.
            deadline = self._queue[0].arrived + self.batch_timeout
            while self._running and self._mergeable() < self.max_batch_size and \
                    loop.time() < deadline:
                self._arrived.clear()
                try:
                    await asyncio.wait_for(self._arrived.wait(), deadline - loop.time())
                except TimeoutError:
                    break
            batch = self._take()
            if not batch:
                self._slots.release()
                continue
            self._running += 1
            loop.create_task(self._run(batch))

    def _live_head(self):
        """Drops cancelled requests at the head; whether a live one is left."""
        while self._queue and self._queue[0].future.done():
            self._queued_examples -= self._queue.popleft().size
        return bool(self._queue)

    def _mergeable(self):
        """Examples the head request could run with now (every live request of its key)."""
        head = self._queue[0]
        if not head.mergeable:
            return self.max_batch_size  # runs alone: nothing to wait for
        return sum(p.size for p in self._queue
                   if p.key == head.key and p.mergeable and not p.future.done())

    def _take(self):
        """The head request and the later ones of its key that fit into one batch."""
        if not self._live_head():
            return []
        head = self._queue.popleft()
        self._queued_examples -= head.size
        batch, total, kept = [head], head.size, collections.deque()
        while self._queue and self.max_batch_size and head.mergeable:
            pending = self._queue.popleft()
            if pending.future.done():
                self._queued_examples -= pending.size
            elif pending.key == head.key and pending.mergeable and \
                    total + pending.size <= self.max_batch_size:
                batch.append(pending)
                total += pending.size
                self._queued_examples -= pending.size
            else:
                kept.append(pending)
        kept.extend(self._queue)
        self._queue = kept
        return batch

    async def _run(self, batch):
        try:
            live = [p for p in batch if not p.future.done()]  # clients may have gone
            if not live:
                return
            names = list(live[0].inputs)
            inputs = {name: np.concatenate([p.inputs[name] for p in live]) for name in names}
            loop = asyncio.get_running_loop()
            self.batches_run += 1
            try:
                outputs = await loop.run_in_executor(self.executor, self.run, live[0].key,
                                                     inputs)
                answers = _split(outputs, [p.size for p in live])
            except Exception as error:  # noqa: BLE001 - handed to every request of the batch
                answers = [error] * len(live)
            for pending, answer in zip(live, answers):
                if pending.future.done():
                    continue
                if isinstance(answer, Exception):
                    pending.future.set_exception(answer)
                else:
                    pending.future.set_result(answer)
        finally:
            self._running -= 1
            self._slots.release()


def _split(outputs, sizes):
    """Each request's rows of merged `outputs` (a single request gets them whole)."""
    if len(sizes) == 1:
        return [outputs]
    total = sum(sizes)
    for name, value in outputs.items():
        if np.ndim(value) == 0 or len(value) != total:
            raise ValueError(f"Output {name!r} has shape {list(np.shape(value))}, not a first "
                             f"dimension of {total} examples: it cannot be split per request")
    bounds = np.cumsum([0] + sizes)
    return [{name: value[start:end] for name, value in outputs.items()}
            for start, end in zip(bounds[:-1], bounds[1:])]
