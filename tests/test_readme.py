"""The README's Python examples run as written."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_blocks_run(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) >= 2
    assert len(blocks[0].strip().splitlines()) <= 12  # the "10-line example"
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)
    out = capsys.readouterr().out
    shape, err = out.strip().split(") ")
    assert shape == "(2, 1024, 8, 64"
    assert float(err) < 1e-4
    assert namespace["grads"].shape == (2, 1024, 8, 64)


def test_readme_is_its_generated_form():
    """The feature matrix and the results summary are generated (from the registered specs
    and reports/index.md), never typed by hand."""
    from experiments import readme

    text = README.read_text(encoding="utf-8")
    assert text == readme.render(text, readme.sections()), (
        f"README.md is out of date; regenerate it with `{readme.REGENERATE}`")


def test_readme_is_short_undated_and_its_links_exist():
    text = README.read_text(encoding="utf-8")
    assert len(text.encode()) <= 12 * 1024
    assert not re.findall(r"\b20\d\d-\d\d-\d\d\b", text)  # dated results live in reports/
    links = re.findall(r"\]\(([^)#:]+)\)", text)
    assert links
    missing = [link for link in links if not (README.parent / link).exists()]
    assert missing == []


def test_results_summary_reads_the_index_verdicts():
    from experiments import readme

    index = ("# x\n\n## Verdicts per paper\n\n| paper | experiment | run | holds | fails | "
             "not tested |\n|---|---|---|---|---|---|\n| P | a | full | 2 | 1 | 0 |\n"
             "| P | a | quick | 9 | 9 | 9 |\n| Q | b | full | 0 | 3 | 4 |\n\n## Claims\n")
    body = readme.results_section(index)
    assert "| [a](reports/a/) | P | 2 | 1 | 0 |" in body and "| 9 |" not in body
    assert "| **all** (2) | | 2 | 4 | 4 |" in body
