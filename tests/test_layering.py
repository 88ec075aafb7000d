"""The floors of docs/pipeline.md, checked on the code's own imports: no module imports one of
a higher floor, and no folder imports a folder that imports it back.

Every import of `keras_attn` is read from the source (`ast`), the ones inside functions too,
so a lazy import cannot hide a loop."""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "keras_attn"

# Top-level module or package of keras_attn -> its floor (docs/pipeline.md, "The map").
FLOORS = {
    "layers": 1, "errors": 1, "atomic_files": 1, "machine": 1, "version": 1,
    "console_startup": 1, "sample_data": 1,
    "models": 2, "text": 2, "generation": 2, "visualization": 2, "page_sections": 2,
    "runs": 3,
    "training": 4, "quantization": 4, "export": 4, "checkpoints": 4, "translation": 4,
    "translation_qat": 4, "text_generation": 4,
    "stages": 5,
    "cli": 6,
}


def module_name(path):
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(source, package):
    """The `keras_attn` modules the code `source` of a module of `package` imports, anywhere
    in it (relative imports resolved)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            # `from keras_attn.x import y`: y may be a module of x
            found += [base] + [f"{base}.{alias.name}" for alias in node.names]
    return [m for m in found if m.startswith("keras_attn.")]


def existing_module(name):
    parts = name.split(".")
    while parts:
        path = PACKAGE.parent.joinpath(*parts)
        if path.with_suffix(".py").is_file() or (path / "__init__.py").is_file():
            return ".".join(parts)
        parts.pop()
    return None


def import_edges():
    """`(importer, imported)` module pairs of keras_attn, package faces included."""
    edges = set()
    for path in PACKAGE.rglob("*.py"):
        importer = module_name(path)
        package = importer if path.name == "__init__.py" else importer.rsplit(".", 1)[0]
        for name in imported_modules(path.read_text(encoding="utf-8"), package):
            target = existing_module(name)
            if target and target != importer and target != "keras_attn":
                edges.add((importer, target))
    return edges


def top(module):
    return module.split(".")[1]


def folder(module):
    """The folder a module lives in (a package is in its own folder); a module of the
    package's root, a floor of its own, stands for itself."""
    path = PACKAGE.parent.joinpath(*module.split("."))
    if path.is_dir() or module.count(".") == 1:
        return module
    return module.rsplit(".", 1)[0]


def test_every_top_level_module_has_a_floor():
    names = {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    names |= {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert sorted(names - set(FLOORS) - {"__main__"}) == []


def test_no_module_imports_a_higher_floor():
    upward = sorted(f"{a} (floor {FLOORS[top(a)]}) imports {b} (floor {FLOORS[top(b)]})"
                    for a, b in import_edges()
                    if a != "keras_attn" and FLOORS[top(a)] < FLOORS[top(b)])
    assert upward == []


def test_no_folder_imports_a_folder_that_imports_it():
    graph = {}
    for a, b in import_edges():
        if a != "keras_attn" and folder(a) != folder(b):
            graph.setdefault(folder(a), set()).add(folder(b))
    loops = []

    def visit(node, path):
        for nxt in sorted(graph.get(node, ())):
            if nxt in path:
                loops.append(" -> ".join(path[path.index(nxt):] + [nxt]))
            elif len(path) < 12:
                visit(nxt, path + [nxt])

    for start in sorted(graph):
        visit(start, [start])
    assert loops == []


@pytest.mark.parametrize("source, floor", [
    ("import keras_attn.stages.run_exporter\n", 5),
    ("def f():\n    from keras_attn.cli import flags\n", 6),
    ("from ..stages import export_options\n", 5),
    ("from .task_registry import task_spec\n", 3),
])
def test_the_check_sees_top_level_function_and_relative_imports(source, floor):
    found = {existing_module(m) for m in imported_modules(source, "keras_attn.runs")}
    assert max(FLOORS[top(m)] for m in found if m != "keras_attn") == floor
