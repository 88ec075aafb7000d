"""docs/api.md is generated from the code; it must match what `tools/make_api_docs.py` writes."""

import re

import pytest

from tests.scripts import ROOT
from tests.scripts import load_script


def _tool():
    return load_script("tools/make_api_docs.py")


@pytest.mark.tensorflow
def test_api_reference_is_up_to_date():
    tool = _tool()
    assert (ROOT / "docs" / "api.md").read_text(encoding="utf-8") == tool.render(), (
        "docs/api.md is out of date: run python tools/make_api_docs.py")


def test_docstring_sections_are_parsed():
    summary, args = _tool()._sections("""Adds numbers.

    More text.

    Args:
        a: the first
            number, continued.
        b: the second.

    Returns:
        the sum.
    """)
    assert summary == "Adds numbers."
    assert args == [["a", "the first number, continued."], ["b", "the second."]]


@pytest.mark.tensorflow
def test_every_name_of_the_reference_imports():
    """Each `### `keras_attn.…`` entry of docs/api.md (even one the page kept after the code
    moved) names a module attribute that imports, and its source link exists."""
    from tests.docs_check import link_problems
    from tests.docs_check import resolves

    page = ROOT / "docs" / "api.md"
    text = page.read_text(encoding="utf-8")
    names = re.findall(r"^### `(keras_attn\.[\w.]+)`$", text, re.MULTILINE)
    assert len(names) > 100
    assert [name for name in names if not resolves(name)] == []
    assert link_problems(page, text) == []
