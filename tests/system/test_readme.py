"""The README's driver example runs and gives the answer it promises."""

import re
from pathlib import Path

import numpy as np


def test_readme_driver_example_runs():
    text = (Path(__file__).parent.parent.parent / "README.md").read_text()
    code = re.search(r"## Using the driver.*?```python\n(.*?)```", text, re.S).group(1)
    scope = {"print": lambda *args, **kw: None}
    exec(compile(code, "README.md", "exec"), scope)
    assert all(np.array_equal(r, np.full(100_000, 10)) for r in scope["results"])
