"""Every ```python block of README.md and docs/*.md runs (blocks of one page share state)."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def python_blocks(page):
    text = page.read_text(encoding="utf-8")
    return [(text[: m.start()].count("\n") + 2, m.group(1)) for m in BLOCK.finditer(text)]


# The pages show the TensorFlow workflow (tf.function, SavedModel, TFLite): default backend.
@pytest.mark.tensorflow
@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_page_snippets_run(page, tmp_path, monkeypatch):
    blocks = python_blocks(page)
    if not blocks:
        pytest.skip(f"{page.name} has no python blocks")
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": f"docs_{page.stem}"}
    for line, source in blocks:
        code = compile(source, f"{page.relative_to(ROOT)}:{line}", "exec")
        exec(code, namespace)  # noqa: S102 - running our own documentation is the point
