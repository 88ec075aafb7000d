"""Loading the repository's scripts (`training/`, `export/`, `benchmarks/`, `tools/`),
which are not importable packages, as modules for tests."""

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def load_script(path, name=None):
    """The module of the script at `path` (relative to the repository root), executed.

    Args:
        path: str or path, e.g. `"training/run_results.py"`.
        name: optional module name; defaults to the file's stem.
    """
    path = ROOT / path
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
