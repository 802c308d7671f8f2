"""The README's "From Python" lines run as written."""

import re
from pathlib import Path


def test_readme_python_lines_run():
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = text.split("## From Python", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert len(code.strip().splitlines()) <= 11
    scope = {}
    exec(compile(code, "README.md", "exec"), scope)  # noqa: S102
    cache, prompt = scope["cache"], scope["prompt"]
    assert cache.admit(prompt).cached_tokens == 96
