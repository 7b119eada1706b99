"""Generated multi-step agent tasks where an early fact is needed late (ACON's test bed).

ACON (Kang et al., "ACON: Optimizing Context Compression for Long-horizon LLM Agents",
arXiv 2510.00615) compresses an agent's history and long observations; compression can only
fail when something said early matters later. :class:`RecallTask` is such a task: a linear
sequence of tool observations ::

    step 0            a long tool output with the fact buried in routine lines
                      ("... The vault code is K-48213. ...")
    steps 1..n-2      filler tool outputs (file listings, log lines), some of them long
    step n-1          "Question: what is the vault code? Reply with: answer <value>"

The agent acts after each observation (``next`` until the question, then
``answer <value>``); it succeeds when its last action answers the fact's value exactly.
Observations do not depend on the actions (a fixed tool trace), so a task is a pure function
of its seed and a run can be resumed from its step index alone. Filler text comes from
``faker`` seeded per task: the same seed gives the same task in every process.
"""

from __future__ import annotations

import dataclasses
import functools
import re

import numpy as np

from lcjax.optional import require

__all__ = ["FACTS", "RecallTask", "make_tasks", "parse_answer", "reference_policy"]

# (what the fact is called, the value's prefix letters): the value is PREFIX-ddddd
FACTS = (("vault code", "K"), ("access key", "A"), ("ticket number", "T"),
         ("door code", "D"), ("order id", "R"))

_ANSWER = re.compile(r"^\s*answer\s*[:=]?\s*(\S+)", re.IGNORECASE | re.MULTILINE)


@functools.lru_cache(maxsize=1)
def _faker():
    with require("data", "lcjax.agents.envs"):
        from faker import Faker

    return Faker("en_US")


def _filler_lines(rng: np.random.Generator, n: int) -> list[str]:
    """``n`` routine tool-output lines (deterministic in ``rng``)."""
    fake = _faker()
    fake.seed_instance(int(rng.integers(2**31)))
    kinds = (lambda: f"found file {fake.file_name()}",
             lambda: f"log: {fake.sentence(nb_words=6).rstrip('.')}",
             lambda: f"user {fake.user_name()} logged in",
             lambda: f"status of {fake.word()} service: ok")
    return [kinds[int(rng.integers(len(kinds)))]() for _ in range(n)]


@dataclasses.dataclass(frozen=True)
class RecallTask:
    """One generated task.

    Attributes:
      seed: the task's seed (everything below is a function of it and the sizes).
      num_steps: observations, the question included (>= 2).
      long_every: every ``long_every``-th filler step is a long output (0: none).
      short_lines, long_lines: lines in a short / long observation.
    """

    seed: int
    num_steps: int = 8
    long_every: int = 3
    short_lines: int = 2
    long_lines: int = 8

    def __post_init__(self):
        if not isinstance(self.num_steps, int) or self.num_steps < 2:
            raise ValueError(f"RecallTask: `num_steps` must be an int >= 2, got "
                             f"{self.num_steps!r}")
        if self.long_every < 0 or self.short_lines < 1 or self.long_lines < 2:
            raise ValueError("RecallTask: need long_every >= 0, short_lines >= 1, "
                             f"long_lines >= 2; got {self.long_every}, {self.short_lines}, "
                             f"{self.long_lines}")

    @functools.cached_property
    def _trace(self) -> tuple[tuple[str, ...], str, str]:
        rng = np.random.default_rng([self.seed, 21])
        name, prefix = FACTS[int(rng.integers(len(FACTS)))]
        value = f"{prefix}-{int(rng.integers(10_000, 100_000))}"
        first = _filler_lines(rng, self.long_lines)
        first.insert(1 + int(rng.integers(self.long_lines - 1)), f"The {name} is {value}.")
        obs = ["Tool output:\n" + "\n".join(first)]
        for step in range(1, self.num_steps - 1):
            long = self.long_every and step % self.long_every == 0
            obs.append("Tool output:\n" + "\n".join(
                _filler_lines(rng, self.long_lines if long else self.short_lines)))
        obs.append(f"Question: what is the {name}? Reply with: answer <value>")
        return tuple(obs), name, value

    @property
    def fact(self) -> str:
        """What the fact is called, e.g. ``"vault code"``."""
        return self._trace[1]

    @property
    def answer(self) -> str:
        """The fact's value, e.g. ``"K-48213"``."""
        return self._trace[2]

    def observation(self, step: int) -> str:
        """The tool observation the agent sees at ``step`` (0-based)."""
        if not 0 <= step < self.num_steps:
            raise ValueError(f"RecallTask: step {step} outside 0..{self.num_steps - 1}")
        return self._trace[0][step]

    def long_steps(self) -> list[int]:
        """The steps whose observation is a long output (step 0 included)."""
        return [0] + [s for s in range(1, self.num_steps - 1)
                      if self.long_every and s % self.long_every == 0]

    def success(self, last_action: str | None) -> bool:
        """Whether the agent's last action answers the fact exactly."""
        return parse_answer(last_action) == self.answer


def parse_answer(action: str | None) -> str | None:
    """The value of an ``answer <value>`` action (its first such line), else None."""
    match = _ANSWER.search(action or "")
    return match.group(1).strip("`'\".,") if match else None


def reference_policy(task: RecallTask, context: str, step: int) -> str:
    """The scripted policy: ``next`` until the last step, then ``answer`` with the first
    ``PREFIX-ddddd`` value written next to the fact's name in ``context`` (what the agent
    sees), or ``answer unknown`` when the context lost it."""
    if step < task.num_steps - 1:
        return "next"
    match = re.search(rf"{re.escape(task.fact)} is ([A-Z]-\d+)", context)
    return f"answer {match.group(1)}" if match else "answer unknown"


def make_tasks(n: int, *, seed: int = 0, **kw) -> list[RecallTask]:
    """``n`` tasks with seeds ``seed .. seed + n - 1`` (``kw``: :class:`RecallTask` sizes)."""
    return [RecallTask(seed + i, **kw) for i in range(n)]
