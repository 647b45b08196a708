"""The shape of hdl/: no function longer than 150 lines (docstring and comments included), so each part of
the RTL reads in one sitting (measured on the syntax tree, nested functions on their own too); and the
subpackages import each other only down the pipeline's layers, so a block's folder never reaches into a
block that uses it."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
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


#: The layers of hdl/: a module may import from its own layer's other packages only where listed, and from
#: any lower layer. The top-level assembly (core, switch, top, blocks, export) is above everything.
LAYERS = {"latency": 0, "toolchain": 0, "common": 1, "parser": 2, "control": 2, "sram": 2, "decision": 3,
          "egress": 3, "alu": 4, "core": 5, "switch": 6, "top": 7, "board": 8,
          "blocks": 9, "export": 10}


def hdl_imports(path: Path, root: Path = REPO / "hdl") -> set[str]:
    """The hdl packages (first component under cais.hdl) that ``path`` (under ``root``, the hdl/ folder)
    imports, relative imports resolved."""
    rel = path.relative_to(root)
    package = ["cais", "hdl", *rel.parts[:-1]]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            names = [name] if node.module or not node.level else [f"{name}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        out |= {n.split(".")[2] for n in names if n.startswith("cais.hdl.")}
    return out


def test_hdl_layers_import_downwards():
    bad = []
    for path in sorted((REPO / "hdl").rglob("*.py")):
        rel = path.relative_to(REPO / "hdl")
        own = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        if own == "__init__":
            continue
        assert own in LAYERS, f"{rel}: a new package of hdl/: give it a layer in LAYERS"
        for used in hdl_imports(path) - {own}:
            if LAYERS[used] >= LAYERS[own]:
                bad.append(f"hdl/{rel} ({own}, layer {LAYERS[own]}) imports {used} (layer {LAYERS[used]})")
    assert not bad, bad


def test_the_layer_check_resolves_imports(tmp_path):
    """Relative imports of a subpackage's module resolve to the packages they name: a hand-made module of
    sram/ importing the decision (a back edge) and the lane's real imports."""
    probe = tmp_path / "sram" / "probe.py"
    probe.parent.mkdir()
    probe.write_text("from ..decision import Decision\nfrom . import slots\nfrom ..common import axis\n")
    assert hdl_imports(probe, tmp_path) == {"decision", "sram", "common"}
    assert hdl_imports(REPO / "hdl" / "alu" / "lane.py") >= {"decision", "egress", "common"}
