"""The README's Python example runs as written."""

from __future__ import annotations

import contextlib
import io
import os
import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_example_runs(tmp_path):
    text = README.read_text()
    section = text[text.index("## Python") :]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert blocks, "README.md has a Python example"
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(blocks[0], "README.md", "exec"), {})
    finally:
        os.chdir(cwd)
    assert "generations" in out.getvalue()
    assert (tmp_path / "py-index").is_dir()
