"""NoLiMa-style tasks: retrieval through a latent association, not a literal match.

Our own reimplementation of the idea of NoLiMa (Modarressi et al., 2025, "NoLiMa:
Long-Context Evaluation Beyond Literal Matching"; adobe-research/NoLiMa — its data and code
are under a non-commercial licence and are not used): the needle and the question share no
content word, so a model cannot find the needle by matching the question's words. In NoLiMa
the link is world knowledge (the needle says "Yuki lives next to the Semper Opera House",
the question asks who has been to Dresden). Here the prompt itself states the link in a
preamble of facts, so every item is solvable from the prompt alone and the association is
made-up (no model knows it beforehand):

* one hop: facts ``"The Copper Lantern is in Velmora."``; needle ``"Actually, Priya lives
  next to the Copper Lantern."``; question ``"Which character has been to Velmora?"``;
* two hops: ``"The Copper Lantern is in the Amber Quarter."`` and ``"The Amber Quarter lies
  within Velmora."`` (an alias chain);
* control (``control=True``): the literal-match version — the needle names the place
  (``"Actually, Priya has been to Velmora."``), as NoLiMa's literal controls do.

``num_distractors`` other characters sit at other landmarks (with their own facts) in the
haystack, so matching *any* landmark is not enough. Depth and length work as in
:mod:`lcjax.data.ruler` (whole haystack units, tokens of any tokenizer). A sample exposes
``needle`` (the one haystack sentence that holds the answer), ``question`` (the question
sentence), ``answer`` (the character's name) and ``control``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from lcjax.data import ruler
from lcjax.data.suites import Suite, SuiteTask

__all__ = ["NEEDLES", "CONTROL_NEEDLE", "PREFIX", "QUESTION", "SUITE", "TASKS", "generate",
           "nolima", "suite"]

PREFIX = ("Read the facts and the story below, then answer the question about the story.\n"
          "Facts:\n{facts}\nStory:\n")
QUESTION = "Which character has been to {place}?"
ANSWER_PROMPT = "\nQuestion: {question} Answer with the name only. Answer: "
NEEDLES = ("Actually, {name} lives next to the {landmark}.",
           "{name} spent a long evening inside the {landmark}.",
           "Yesterday {name} painted a picture of the {landmark} from across the road.")
CONTROL_NEEDLE = "Actually, {name} has been to {place}."
FACT_1 = "The {landmark} is in {place}."
FACT_2A = "The {landmark} is in the {district} Quarter."
FACT_2B = "The {district} Quarter lies within {place}."

_NAMES = ("Yuki", "Mateo", "Priya", "Kofi", "Ingrid", "Tariq", "Lena", "Omar", "Zara",
          "Dmitri", "Aiko", "Ravi", "Nadia", "Jonas", "Elif", "Kenji", "Sofia", "Bilal",
          "Freya", "Hamid", "Leila", "Marek", "Noor", "Oskar", "Rania", "Soren", "Tomas",
          "Yara", "Anika", "Emeka")
_MATERIALS = ("Copper", "Silver", "Marble", "Cedar", "Crystal", "Iron", "Velvet", "Granite",
              "Amber", "Ivory", "Cobalt", "Jade", "Onyx", "Saffron", "Bronze", "Pewter")
_BUILDINGS = ("Lantern", "Pavilion", "Observatory", "Bathhouse", "Clocktower", "Arcade",
              "Lighthouse", "Aqueduct", "Rotunda", "Conservatory", "Gatehouse", "Mill")
_DISTRICTS = ("Ochre", "Heron", "Thistle", "Lark", "Juniper", "Falcon", "Sorrel", "Willow",
              "Quartz", "Kestrel", "Bramble", "Linden")
_SYLLABLES = ("vel", "mor", "ka", "dun", "ris", "tal", "bre", "zon", "qui", "las", "nor",
              "pe", "sha", "vok", "ul", "tre", "min", "gar")


def _place(rng, taken: set[str]) -> str:
    while True:
        s = "".join(_SYLLABLES[i] for i in rng.integers(len(_SYLLABLES), size=3)).title()
        if s not in taken:
            taken.add(s)
            return s


def _pick(rng, options: Sequence[str], count: int) -> list[str]:
    return [options[i] for i in rng.choice(len(options), count, replace=False)]


def nolima(seed, length: int, *, hops: int = 1, control: bool = False,
           num_distractors: int = 2, haystack_kind: str = "essay",
           depth: float | Sequence[float] | None = None, tokenizer=None) -> Sample:
    """A NoLiMa-style sample of ``length`` tokens (prompt + answer).

    Args:
      seed: int or ``np.random.Generator``.
      hops: 1 (landmark -> place) or 2 (landmark -> district -> place).
      control: the literal-match control item (the needle names the place).
      num_distractors: other characters at other landmarks (in other places).
      haystack_kind: ``"essay"`` (Shakespeare) or ``"noise"``.
      depth: as :func:`lcjax.data.ruler.niah` (the target needle first).
      tokenizer: what ``length`` counts.
    """
    name = "nolima"
    if hops not in (1, 2) or num_distractors < 0 or num_distractors + 1 > len(_BUILDINGS):
        raise ValueError(f"{name}: need hops in (1, 2) and 0 <= num_distractors < "
                         f"{len(_BUILDINGS)}; got hops={hops}, num_distractors={num_distractors}")
    if haystack_kind not in ("essay", "noise"):
        raise ValueError(f"{name}: haystack_kind must be 'essay' or 'noise', "
                         f"got {haystack_kind!r}")
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    n = num_distractors + 1
    names = _pick(rng, _NAMES, n)
    landmarks = [f"{m} {b}" for m, b in zip(_pick(rng, _MATERIALS, n), _pick(rng, _BUILDINGS, n))]
    districts = _pick(rng, _DISTRICTS, n)
    taken: set[str] = set()
    places = [_place(rng, taken) for _ in range(n)]
    facts = []
    for lm, dist, pl in zip(landmarks, districts, places):
        if hops == 1:
            facts.append(FACT_1.format(landmark=lm, place=pl))
        else:
            facts += [FACT_2A.format(landmark=lm, district=dist),
                      FACT_2B.format(district=dist, place=pl)]
    facts = [facts[i] for i in rng.permutation(len(facts))]
    templates = [NEEDLES[i] for i in rng.integers(len(NEEDLES), size=n)]
    needles = [(CONTROL_NEEDLE if control else t).format(name=nm, landmark=lm, place=pl)
               for t, nm, lm, pl in zip(templates, names, landmarks, places)]
    depths = [float(d) for d in _depths(rng, depth, n)]
    question = QUESTION.format(place=places[0])
    refs = (names[0].encode(),)
    pool, sep = ruler.haystack_pool(haystack_kind, rng)
    sample = ruler.needle_sample(
        f"nolima_{'control' if control else f'{hops}hop'}", length, tokenizer,
        prefix=PREFIX.format(facts="\n".join(facts)),
        question=ANSWER_PROMPT.format(question=question),
        answer_of=lambda placed: (refs, refs[0]), pool=pool, sep=sep, needles=needles,
        depths=depths, num_targets=1,
        info={"names": tuple(names), "landmarks": tuple(landmarks), "places": tuple(places),
              "districts": tuple(districts) if hops == 2 else (), "facts": tuple(facts),
              "hops": hops, "haystack": haystack_kind})
    return dataclasses.replace(sample, question=question.encode(), needle=needles[0].encode(),
                               control=control)


def _depths(rng, depth, count):
    if depth is None:
        return rng.random(count)
    if isinstance(depth, Sequence | np.ndarray):
        if len(depth) != count:
            raise ValueError(f"nolima: got {len(depth)} depths for {count} needles")
        return [_check(d) for d in depth]
    return [_check(depth)] + list(rng.random(count - 1))


def _check(d) -> float:
    d = float(d)
    if not 0.0 <= d <= 1.0:
        raise ValueError(f"nolima: depth must lie in [0, 1], got {d}")
    return d


Sample = ruler.Sample

SUITE: tuple[SuiteTask, ...] = (
    SuiteTask("nolima_1hop", "nolima", dict(hops=1)),
    SuiteTask("nolima_2hop", "nolima", dict(hops=2)),
    SuiteTask("nolima_control", "nolima", dict(hops=1, control=True)),
    SuiteTask("nolima_1hop_noise", "nolima", dict(hops=1, haystack_kind="noise")),
)
TASKS = {t.name: dict(t.overrides) for t in SUITE}


def generate(task: str, seed, length: int, *, tokenizer=None, **overrides) -> Sample:
    """One sample of a task of :data:`TASKS` or of ``"nolima"`` itself (``overrides``
    replace its keywords); ``length`` in tokens of ``tokenizer``."""
    if task == "nolima":
        kwargs = {}
    elif task in TASKS:
        kwargs = TASKS[task]
    else:
        raise ValueError(f"generate: unknown task {task!r}; known: {sorted(TASKS)}")
    return nolima(seed, length, tokenizer=tokenizer, **{**kwargs, **overrides})


def suite() -> Suite:
    """The NoLiMa-style suite (built-in ``"nolima"``, :data:`lcjax.data.suites.BUILTIN_SUITES`)."""
    return Suite("nolima", generate, SUITE)
