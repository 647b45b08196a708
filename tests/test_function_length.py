"""House rule: no function in hdl/ is longer than 150 lines (docstring and comments included), so each part
of the RTL reads in one sitting. Measured on the source's syntax tree, nested functions on their own too."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAX_LINES = 150


def long_functions(source: str, filename: str, limit: int = MAX_LINES) -> list[str]:
    """``file:line name (n lines)`` for every function or method in ``source`` longer than ``limit`` lines,
    from its ``def`` line (decorators not counted) to its last line."""
    out = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - node.lineno + 1
            if lines > limit:
                out.append(f"{filename}:{node.lineno} {node.name} ({lines} lines)")
    return out


def test_the_measure_counts_def_to_last_line():
    """A hand-made case: a method of 151 lines (def, 149 body lines, return) is reported, one of 150 is not,
    and a 151-line function nested in a short one is reported by its own name."""
    body = "".join(f"        x{i} = {i}\n" for i in range(149))
    long_src = "class C:\n    def f(self):\n" + body + "        return 0\n"
    short_src = "class C:\n    def f(self):\n" + body[:-len("        x148 = 148\n")] + "        return 0\n"
    nested = "def outer():\n    def inner():\n" + body + "        return 0\n    return inner\n"
    assert long_functions(long_src, "a.py") == ["a.py:2 f (151 lines)"]
    assert long_functions(short_src, "b.py") == []
    assert [r.split()[1] for r in long_functions(nested, "c.py")] == ["outer", "inner"]


def test_no_hdl_function_is_longer_than_150_lines():
    files = sorted((REPO / "hdl").rglob("*.py"))
    assert len(files) > 20, "hdl/ not found where expected"
    too_long = [r for path in files for r in long_functions(path.read_text(), str(path.relative_to(REPO)))]
    assert not too_long, too_long
