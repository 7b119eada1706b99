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
