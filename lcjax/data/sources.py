"""grain training sources for the task suites: one training row per index.

A :class:`TaskSource` is a grain ``RandomAccessDataSource`` (``__len__``, ``__getitem__``):
record ``i`` is a fresh sample of a suite task generated from seed ``(seed, i)`` — so it is
the same in every process and after every resume — turned into the byte-token row of
:func:`lcjax.data.ruler.make_batch` (``inputs``, ``targets``, ``loss_mask`` of ``[T]``,
``answer_start``, ``answer_len``), ready for ``lcjax.train.train(dataset=...)``::

    src = TaskSource("ruler", "niah_single_1", length=512, num_records=10_000)
    ds = grain.MapDataset.source(src).shuffle(seed=0).batch(8)
    train(model_cfg, TrainConfig(steps=500), dataset=ds, loss_fn=...)

``tasks`` may name several tasks of the suite (None: all of them); record ``i`` then comes
from task ``i % len(tasks)``. Rows are byte tokens (lcjax's models), ``seq_len`` wide
(default ``length``): lengths are in bytes and exact, so every row has ``T = length``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from lcjax.data.ruler import make_batch
from lcjax.data.suites import Suite, get_suite

__all__ = ["TaskSource", "stage_batches", "task_batches"]

TRAIN_KEYS = ("inputs", "targets", "loss_mask")


class TaskSource:
    """Deterministic per-index training rows of one or several tasks of a suite.

    Args:
      suite: a registered suite name (``"ruler"``, ``"nolima"``) or a
        :class:`lcjax.data.suites.Suite` (e.g. one with shorter templates).
      tasks: a task name of the suite, a list of them, or None (every task).
      length: sample length (bytes).
      num_records: ``len(source)``.
      seed: base seed; record ``i`` uses ``np.random.default_rng([seed, i])``.
      depth: the needle depth for tasks that take one (None: uniform).
      seq_len: row width (default ``length``); ``eos``: append EOS to the answer.
      overrides: extra generator keywords for every task.
    """

    def __init__(self, suite: str | Suite, tasks: str | Sequence[str] | None = None, *, length: int,
                 num_records: int, seed: int = 0, depth: float | None = None,
                 seq_len: int | None = None, eos: bool = False,
                 overrides: Mapping[str, Any] | None = None):
        if num_records < 1:
            raise ValueError(f"TaskSource: `num_records` must be >= 1, got {num_records}")
        self.suite = suite if isinstance(suite, Suite) else get_suite(suite)
        names = [t.name for t in self.suite.tasks] if tasks is None else (
            [tasks] if isinstance(tasks, str) else list(tasks))
        self.tasks = tuple(self.suite.task(n) for n in names)
        self.length, self.num_records, self.seed = length, num_records, seed
        self.depth, self.seq_len, self.eos = depth, seq_len or length, eos
        self.overrides = dict(overrides or {})

    def __len__(self) -> int:
        return self.num_records

    def sample(self, index: int):
        """The :class:`lcjax.data.ruler.Sample` of record ``index``."""
        if not 0 <= index < self.num_records:
            raise IndexError(f"TaskSource: index {index} out of range [0, {self.num_records})")
        t = self.tasks[index % len(self.tasks)]
        kw = {**t.overrides, **self.overrides}
        if t.uses_depth and self.depth is not None:
            kw["depth"] = self.depth
        return self.suite.generate(t.task, np.random.default_rng([self.seed, index]),
                                   self.length, **kw)

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        batch = make_batch([self.sample(int(index))], self.seq_len, eos=self.eos)
        return {k: v[0] for k, v in batch.items()}

    def __repr__(self) -> str:
        return (f"TaskSource({self.suite.name!r}, {[t.name for t in self.tasks]}, "
                f"length={self.length}, num_records={self.num_records}, seed={self.seed})")


def task_batches(suite: str | Suite, tasks: str | Sequence[str] | None, *, length: int,
                 steps: int, batch: int, seed: int = 0):
    """``steps`` batches of ``batch`` training rows of ``tasks`` at ``length`` bytes.

    A grain ``MapDataset`` over a :class:`TaskSource` (``eos=True``, rows
    ``length + 1`` wide: BOS + prompt + answer + EOS), batched with ``drop_remainder`` and
    cut to the keys the train loop reads (``inputs``, ``targets``, ``loss_mask``, each
    ``[batch, length + 1]``) — the dataset of every experiment that trains on a task suite.
    """
    import grain

    src = TaskSource(suite, tasks, length=length, num_records=steps * batch, seed=seed,
                     eos=True, seq_len=length + 1)
    return (grain.MapDataset.source(src).batch(batch, drop_remainder=True)
            .map(lambda b: {k: b[k] for k in TRAIN_KEYS}))


def stage_batches(suite: str | Suite, stages: Sequence[tuple[int, int, Any]], *, batch: int,
                  seed: int = 0):
    """A curriculum in one dataset: the stages' :func:`task_batches` one after the other
    (``grain.MapDataset.concatenate``). Stage ``k`` = ``(length, steps, tasks)`` gives
    ``steps`` batches of ``tasks`` at ``length`` bytes from TaskSource seed ``seed + k``;
    the train loop compiles once per row width (give it ``seq_len`` = the widest + 1)."""
    import grain

    parts = [task_batches(suite, tasks, length=length, steps=steps, batch=batch, seed=seed + k)
             for k, (length, steps, tasks) in enumerate(stages)]
    if not parts:
        raise ValueError("stage_batches: `stages` is empty")
    return parts[0] if len(parts) == 1 else grain.MapDataset.concatenate(parts)
