"""docs/api.md is generated from the code; it must match what `tools/make_api_docs.py` writes."""

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
