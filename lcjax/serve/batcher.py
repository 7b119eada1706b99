"""Request batching for ``lcjax serve``: concurrent requests become one jitted
:func:`lcjax.nn.generate` call.

A worker thread takes the first waiting request, then every request that arrives within
``window_ms`` of it (at most ``max_batch``), groups them by sampling parameters and runs
each group as ONE ``generate`` call on a padded batch:

    rows     B_pad = the next power of two >= the group's size (at most ``max_batch``);
             the spare rows repeat row 0 and their output is dropped
    prompt   P_pad = :func:`prompt_bucket` ``(max_b len_b)``, the next power of two (at
             least ``min_bucket``; right padding, masked by ``prompt_lengths``)
    decode   N_pad = the next power of two >= max_b max_tokens_b; row b keeps its first
             max_tokens_b tokens

so the number of compiled programs is at most (batch buckets) x (prompt buckets) x (decode
buckets) x (greedy, sampled), :func:`shape_bound`: a handful of powers of two each (for a
context of 2048, ``max_batch`` 8, ``min_bucket`` 16: 4 x 8 x 12 x 2), never one per request.
Greedy decoding of a row does not depend on the other rows
or on the padding (:func:`lcjax.nn.generate`), so a batched greedy reply equals the reply
to the request alone. ``generate`` takes one temperature and top-p per call, hence the
grouping; a sampled request with a ``seed`` runs as row 0 of its own call with
``rng =`` :func:`seed_key` ``(seed)`` (all 64 bits of the seed; ``jax.random.key(seed)``
for seeds below 2**31; row b's stream is ``fold_in(fold_in(rng, b), step)``, and a
row's samples do not depend on the batch size), so the same seed gives the same reply
whatever else is in flight. Unseeded sampled requests share a call and a fresh seed.

:attr:`Batcher.stats` counts the ``generate`` calls and their batch sizes;
:attr:`Batcher.pending` the requests submitted and not yet finished (the server's queue
limit). A request whose future is cancelled before its batch starts is dropped unrun; on
``stop()`` the waiting requests fail at once and only the running batch finishes.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import queue
import threading
import time
from collections.abc import Sequence

import numpy as np

from lcjax import nn

__all__ = ["TOP_LOGPROBS", "BatchStats", "Batcher", "Generation", "ShuttingDown", "group_jobs",
           "next_power_of_two", "prompt_bucket", "seed_key", "shape_bound"]

SEED_LIMIT = 1 << 64
# every generate call also returns this many most likely tokens per step (OpenAI's largest
# ``logprobs``), so a request asking for log-probs needs no other compiled program
TOP_LOGPROBS = 5


class ShuttingDown(RuntimeError):
    """The batcher stopped before this request ran."""


@dataclasses.dataclass(frozen=True)
class Generation:
    """One request's output.

    tokens: int32 [n], the generated ids (n <= max_tokens), a final stop id included.
    stopped: True if the row ended on a stop id (OpenAI's finish_reason "stop"), False if it
      ran to ``max_tokens`` ("length").
    logprobs: float32 [n], log p_model of each generated token (``generate``'s
      ``return_logprobs``: temperature 1, no filtering), or None.
    top_ids, top_logprobs: int32 / float32 [n, TOP_LOGPROBS], the most likely tokens at each
      step and their log-probs, most likely first (``generate``'s ``top_logprobs``), or None.
    """

    tokens: np.ndarray
    stopped: bool
    logprobs: np.ndarray | None = None
    top_ids: np.ndarray | None = None
    top_logprobs: np.ndarray | None = None


@dataclasses.dataclass
class _Job:
    ids: np.ndarray
    max_tokens: int
    temperature: float
    top_p: float | None
    seed: int | None
    future: concurrent.futures.Future
    serial: int


@dataclasses.dataclass
class BatchStats:
    """What the batcher ran: ``batch_sizes[i]`` requests in ``generate`` call i, padded to
    ``shapes[i] = (B_pad, P_pad, N_pad)``."""

    batch_sizes: list[int] = dataclasses.field(default_factory=list)
    shapes: list[tuple[int, int, int]] = dataclasses.field(default_factory=list)
    cache_clears: int = 0

    @property
    def generate_calls(self) -> int:
        return len(self.batch_sizes)

    @property
    def requests(self) -> int:
        return sum(self.batch_sizes)

    def as_dict(self) -> dict:
        return {"generate_calls": self.generate_calls, "requests": self.requests,
                "batch_sizes": list(self.batch_sizes),
                "shapes": [list(s) for s in self.shapes],
                "distinct_shapes": len(set(self.shapes)), "cache_clears": self.cache_clears}


def next_power_of_two(n: int) -> int:
    """The smallest power of two >= n (n >= 1)."""
    if n < 1:
        raise ValueError(f"next_power_of_two: `n` must be >= 1, got {n}")
    return 1 << (int(n) - 1).bit_length()


def prompt_bucket(n: int, min_bucket: int = 16) -> int:
    """The padded prompt length of a batch whose longest prompt has ``n`` tokens: the next
    power of two >= max(n, min_bucket)."""
    return next_power_of_two(max(int(n), int(min_bucket)))


def shape_bound(max_len: int, max_batch: int, min_bucket: int) -> int:
    """The most distinct compiled ``generate`` shapes a server with context ``max_len``
    can need: batch buckets x prompt buckets x decode buckets x (greedy, sampled)."""
    batch = next_power_of_two(max_batch).bit_length()
    prompt = max(1, (next_power_of_two(max_len).bit_length()
                     - next_power_of_two(min_bucket).bit_length() + 1))
    decode = next_power_of_two(max_len).bit_length()
    return batch * prompt * decode * 2


def seed_key(seed: int):
    """A ``jax.random`` key from all 64 bits of ``seed`` (0 <= seed < 2**64):
    ``key(lo)`` folded with ``hi`` (the upper 32 bits) when ``hi > 0``, so seeds 2**32
    apart differ; for ``seed < 2**31`` it is ``jax.random.key(seed)``."""
    import jax

    if not 0 <= int(seed) < SEED_LIMIT:
        raise ValueError(f"seed_key: `seed` must lie in [0, 2**64), got {seed}")
    lo, hi = int(seed) & 0xFFFFFFFF, int(seed) >> 32
    key = jax.random.key(np.uint32(lo))
    return jax.random.fold_in(key, np.uint32(hi)) if hi else key


class Batcher:
    """Runs generation requests in batches on a worker thread.

    Args:
      model: an ``lcjax.nn.DecoderLM``.
      stop_ids: token ids that end a reply (e.g. EOS).
      pad_id: the padding id.
      window_ms: how long the worker waits, after the first request of a batch, for more.
      max_batch: the most requests in one ``generate`` call.
      min_bucket: the smallest prompt bucket (:func:`prompt_bucket`).
      max_shapes: the most compiled shapes kept: a new shape beyond it clears JAX's
        compile caches first (``jax.clear_caches()``; counted in ``stats.cache_clears``), so
        the compiled programs' memory stays bounded whatever the requests.

    ``start()`` starts the worker, ``submit(...)`` returns a future of a
    :class:`Generation`, ``stop()`` ends the worker (waiting requests fail with
    ``RuntimeError``).
    """

    def __init__(self, model, *, stop_ids: Sequence[int], pad_id: int, window_ms: float = 10.0,
                 max_batch: int = 8, min_bucket: int = 16, seed: int = 0,
                 max_shapes: int = 32):
        if not window_ms >= 0:
            raise ValueError(f"Batcher: `window_ms` must be >= 0, got {window_ms!r}")
        if not isinstance(max_batch, int) or max_batch < 1:
            raise ValueError(f"Batcher: `max_batch` must be an int >= 1, got {max_batch!r}")
        if not isinstance(min_bucket, int) or min_bucket < 1:
            raise ValueError(f"Batcher: `min_bucket` must be an int >= 1, got {min_bucket!r}")
        if not isinstance(max_shapes, int) or max_shapes < 1:
            raise ValueError(f"Batcher: `max_shapes` must be an int >= 1, got {max_shapes!r}")
        self.max_shapes = max_shapes
        self._compiled: set = set()
        self.model = model
        self.stop_ids = tuple(int(i) for i in stop_ids)
        self.pad_id = int(pad_id)
        self.window_s = window_ms / 1000.0
        self.max_batch = max_batch
        self.min_bucket = min_bucket
        self.stats = BatchStats()
        self._rng = np.random.default_rng(seed)
        self._queue: queue.Queue = queue.Queue()
        self._serial = itertools.count()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._stopping = False
        self.pending = 0  # submitted and not yet done (finished, failed or cancelled)

    # --- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        """Starts the worker thread (once)."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="lcjax-serve-batcher",
                                                daemon=True)
                self._thread.start()

    def stop(self, timeout: float | None = 30.0) -> None:
        """Fails the waiting requests at once, then waits at most ``timeout`` seconds for
        the batch that is running; later requests fail."""
        with self._lock:
            thread, self._thread = self._thread, None
            self._stopping = True
        self._fail_waiting(ShuttingDown("the server is shutting down"))
        if thread is not None:
            self._queue.put(None)
            thread.join(timeout)
        self._fail_waiting(ShuttingDown("the server is shutting down"))

    def submit(self, ids, max_tokens: int, *, temperature: float = 0.0,
               top_p: float | None = None, seed: int | None = None
               ) -> concurrent.futures.Future:
        """Queues one request: prompt ``ids`` (int [len >= 1]); a future of its
        :class:`Generation`."""
        ids = np.asarray(ids, np.int32).reshape(-1)
        if ids.size < 1:
            raise ValueError("Batcher.submit: the prompt has no tokens")
        if not isinstance(max_tokens, (int, np.integer)) or max_tokens < 1:
            raise ValueError(f"Batcher.submit: `max_tokens` must be an int >= 1, got "
                             f"{max_tokens!r}")
        if not temperature >= 0:
            raise ValueError(f"Batcher.submit: `temperature` must be >= 0, got {temperature}")
        if top_p is not None and not 0 < top_p <= 1:
            raise ValueError(f"Batcher.submit: `top_p` must lie in (0, 1], got {top_p}")
        if self._thread is None:
            raise RuntimeError("Batcher.submit: the batcher is not running (call start())")
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            self.pending += 1
        future.add_done_callback(self._done)
        self._queue.put(_Job(ids, int(max_tokens), float(temperature),
                             None if top_p is None or top_p >= 1 else float(top_p),
                             None if seed is None else int(seed), future, next(self._serial)))
        return future

    def _done(self, future) -> None:
        with self._lock:
            self.pending -= 1

    # --- worker --------------------------------------------------------------------------
    def _fail_waiting(self, error: Exception) -> None:
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                return
            if job is not None and job.future.set_running_or_notify_cancel():
                job.future.set_exception(error)

    def _collect(self, first: _Job) -> tuple[list[_Job], bool]:
        """``first`` and what arrives within the window (at most max_batch); and whether
        the stop sentinel was seen."""
        jobs = [first]
        deadline = time.monotonic() + self.window_s
        while len(jobs) < self.max_batch:
            left = deadline - time.monotonic()
            try:
                job = self._queue.get(timeout=left) if left > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if job is None:
                return jobs, True
            jobs.append(job)
        return jobs, False

    def _work(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            jobs, stopping = self._collect(first)
            for group in group_jobs(jobs, self.max_batch):
                if self._stopping:  # stop(): only the batch already running finishes
                    group = [j for j in group if j.future.set_running_or_notify_cancel()]
                    for job in group:
                        job.future.set_exception(ShuttingDown("the server is shutting down"))
                    continue
                self._run(group)
            if stopping:
                return

    def _run(self, group: list[_Job]) -> None:
        group = [j for j in group if j.future.set_running_or_notify_cancel()]  # cancelled: out
        if not group:
            return
        try:
            results = self._generate(group)
        except Exception as e:  # every request of the call fails, the server keeps going
            for job in group:
                job.future.set_exception(e)
            return
        for job, result in zip(group, results):
            job.future.set_result(result)

    def batch_buckets(self) -> list[int]:
        """Every padded batch size a group can get: powers of two below ``max_batch``,
        and ``max_batch``."""
        return sorted({min(next_power_of_two(n), self.max_batch)
                       for n in range(1, self.max_batch + 1)})

    def precompile(self, max_prompt_len: int, max_tokens: int) -> list[tuple]:
        """Compiles the greedy programs of every batch bucket x every prompt bucket up to
        ``max_prompt_len`` tokens x the decode bucket of ``max_tokens`` (one dummy
        ``generate`` call each, before serving, so no client waits for those compiles);
        returns the shapes ``(B_pad, P_pad, N_pad)``."""
        if not isinstance(max_prompt_len, int) or max_prompt_len < 1:
            raise ValueError(f"Batcher.precompile: `max_prompt_len` must be an int >= 1, got "
                             f"{max_prompt_len!r}")
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"Batcher.precompile: `max_tokens` must be an int >= 1, got "
                             f"{max_tokens!r}")
        buckets, p = [], prompt_bucket(1, self.min_bucket)
        while True:
            buckets.append(p)
            if p >= max_prompt_len:
                break
            p *= 2
        shapes = []
        for p in buckets:
            for b in self.batch_buckets():
                jobs = [_Job(np.ones(p, np.int32), max_tokens, 0.0, None, None,
                             concurrent.futures.Future(), -1) for _ in range(b)]
                self._generate(jobs)
                shapes.append(self.stats.shapes[-1])
        return shapes

    def _admit_shape(self, shape: tuple) -> None:
        """Clears JAX's compile caches before a new shape would make more than
        ``max_shapes``."""
        if shape in self._compiled:
            return
        if len(self._compiled) >= self.max_shapes:
            import jax

            jax.clear_caches()
            self._compiled.clear()
            self.stats.cache_clears += 1
        self._compiled.add(shape)

    def _generate(self, group: list[_Job]) -> list[Generation]:
        n = len(group)
        b_pad = min(next_power_of_two(n), max(self.max_batch, n))
        p_pad = prompt_bucket(max(len(j.ids) for j in group), self.min_bucket)
        n_pad = next_power_of_two(max(j.max_tokens for j in group))
        self._admit_shape((b_pad, p_pad, n_pad, head_greedy(group)))
        rows = np.full((b_pad, p_pad), self.pad_id, np.int32)
        lengths = np.full(b_pad, len(group[0].ids), np.int32)
        rows[:, :len(group[0].ids)] = group[0].ids  # spare rows copy row 0: with greedy
        for r, job in enumerate(group):            # decoding they stop when it stops, so
            rows[r, :len(job.ids)] = job.ids        # they never keep the loop running
            lengths[r] = len(job.ids)
        head = group[0]
        greedy = head.temperature == 0
        seed = head.seed if head.seed is not None else int(self._rng.integers(2**31))
        out = nn.generate(self.model, rows, n_pad, temperature=head.temperature,
                          top_p=None if greedy else head.top_p, stop_tokens=self.stop_ids,
                          rng=None if greedy else seed_key(seed), prompt_lengths=lengths,
                          pad_id=self.pad_id, return_logprobs=True,
                          top_logprobs=min(TOP_LOGPROBS, self.model.config.vocab_size))
        tokens, ends = np.asarray(out.tokens), np.asarray(out.lengths)
        logprobs = np.asarray(out.logprobs, np.float32)
        top_ids, top_lp = (np.asarray(x) for x in out.top_logprobs)
        self.stats.batch_sizes.append(n)
        self.stats.shapes.append((b_pad, p_pad, n_pad))
        results = []
        for r, job in enumerate(group):
            gen = tokens[r, lengths[r]:ends[r]][:job.max_tokens]
            stopped = bool(gen.size) and int(gen[-1]) in self.stop_ids
            k = gen.size
            results.append(Generation(gen.astype(np.int32), stopped, logprobs[r, :k],
                                      top_ids[r, :k].astype(np.int32),
                                      top_lp[r, :k].astype(np.float32)))
        return results


def head_greedy(group: Sequence[_Job]) -> bool:
    """Whether a group runs greedy (its jobs share the head's sampling)."""
    return group[0].temperature == 0


def group_jobs(jobs: Sequence[_Job], max_batch: int) -> list[list[_Job]]:
    """Jobs that may share one ``generate`` call, in arrival order: greedy ones together,
    sampled ones by (temperature, top_p); a seeded sampled job alone; at most max_batch."""
    groups: dict[tuple, list[_Job]] = {}
    for job in jobs:
        if job.temperature == 0:
            key: tuple = ("greedy",)
        elif job.seed is not None:
            key = ("seeded", job.serial)
        else:
            key = ("sampled", job.temperature, job.top_p)
        groups.setdefault(key, []).append(job)
    return [g[i:i + max_batch] for g in groups.values() for i in range(0, len(g), max_batch)]
