"""Rewrite the generated sections of ``README.md``: the variant feature matrix (from the
registered specs, the table of ``docs/features.md``) and the results summary (from the
verdict table of the committed ``reports/index.md``). Nothing in those sections is typed by
hand; ``tests/test_readme.py`` keeps the README equal to its generated form.

A section is the text between ``<!-- BEGIN GENERATED: <name> -->`` and
``<!-- END GENERATED: <name> -->``.

    python experiments/readme.py          # rewrite README.md
    python experiments/readme.py --check  # exit 1 if README.md is out of date
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

README = ROOT / "README.md"
INDEX = ROOT / "reports" / "index.md"
REGENERATE = "python experiments/readme.py"


def variants_section() -> str:
    """The feature-matrix table of ``lcjax.nn.variants.markdown()`` (docs/features.md)."""
    from lcjax.nn import variants

    table = [line for line in variants.markdown().splitlines() if line.startswith("|")]
    return "\n".join([*table, "", "Columns and footnotes: [docs/features.md](docs/features.md) "
                      f"(`{variants.REGENERATE}`)."])


def verdict_rows(index_text: str) -> list[list[str]]:
    """The rows of the "Verdicts per paper" table of ``reports/index.md``: ``[paper,
    experiment, run, holds, fails, not tested]`` each."""
    match = re.search(r"^## Verdicts per paper\n\n(.*?)\n\n", index_text, re.S | re.M)
    if match is None:
        raise ValueError(f"{INDEX}: no '## Verdicts per paper' table; rebuild it with "
                         "`python experiments/reproduce.py --write-index`")
    lines = match.group(1).splitlines()[2:]  # header and rule
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines]


def results_section(index_text: str) -> str:
    """Claims holding / failing / not tested per experiment (full runs), with totals."""
    rows = [r for r in verdict_rows(index_text) if r[2] == "full"]
    totals = [sum(int(r[k]) for r in rows) for k in (3, 4, 5)]
    lines = ["| experiment | paper | holds | fails | not tested |", "|---|---|---|---|---|"]
    lines += [f"| [{r[1]}](reports/{r[1]}/) | {r[0]} | {r[3]} | {r[4]} | {r[5]} |"
              for r in rows]
    lines += [f"| **all** ({len(rows)}) | | {totals[0]} | {totals[1]} | {totals[2]} |", "",
              "Each claim with its target, our number and the run's command, machine and date: "
              "[reports/index.md](reports/index.md).", ""]
    return "\n".join(lines).rstrip("\n")


def sections() -> dict[str, str]:
    """Every generated section by name."""
    return {"variants": variants_section(),
            "results": results_section(INDEX.read_text(encoding="utf-8"))}


def render(text: str, generated: dict[str, str]) -> str:
    """``text`` with each generated section replaced; ValueError naming a missing marker."""
    for name, body in generated.items():
        begin = f"<!-- BEGIN GENERATED: {name} ({REGENERATE}) -->"
        end = f"<!-- END GENERATED: {name} -->"
        pattern = re.compile(re.escape(begin) + r"\n.*?" + re.escape(end), re.S)
        if not pattern.search(text):
            raise ValueError(f"README: no section {begin!r} ... {end!r}")
        replacement = f"{begin}\n{body}\n{end}"
        text = pattern.sub(lambda _, r=replacement: r, text)
    return text


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if README.md differs from its generated form")
    args = parser.parse_args(argv)
    text = README.read_text(encoding="utf-8")
    new = render(text, sections())
    if args.check:
        if new != text:
            print(f"README.md is out of date; run `{REGENERATE}`")
            return 1
        return 0
    README.write_text(new, encoding="utf-8")
    print(f"wrote {README} ({len(new.encode()):,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
