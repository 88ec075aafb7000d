"""keras_attn.page_sections: a section is replaced between its markers and nothing else on
the page changes; a page without its markers is an error that says what to add."""

import pytest

from keras_attn.page_sections import read_section
from keras_attn.page_sections import replace_section

PAGE = ("# Results\n\nHand-written intro.\n\n<!-- a:begin -->\n| old | table |\n"
        "<!-- a:end -->\n\nHand-written notes.\n\n"
        "<!-- b:begin -->\nB's table\n<!-- b:end -->\n\n<!-- translation:begin -->\nT\n"
        "<!-- translation:end -->\n")


def test_only_the_named_section_changes(tmp_path):
    page = tmp_path / "results.md"
    page.write_text(PAGE)
    before = page.read_text()
    replace_section(page, "a", "| new | table |\n| 1 | 2 |\n")
    after = page.read_text()
    assert read_section(page, "a") == "| new | table |\n| 1 | 2 |"
    assert after.replace("| new | table |\n| 1 | 2 |", "| old | table |") == before
    assert read_section(page, "b") == "B's table"
    replace_section(page, "a", "| old | table |")  # written back: the page is as it was
    assert page.read_text() == before


def test_a_new_page_holds_only_the_section(tmp_path):
    page = tmp_path / "new.md"
    assert read_section(page, "a") == ""
    replace_section(page, "a", "body")
    assert page.read_text() == "<!-- a:begin -->\nbody\n<!-- a:end -->\n"


@pytest.mark.parametrize("text, message", [
    ("# Page\n", r"add the line\(s\) <!-- a:begin --> and <!-- a:end -->"),
    ("<!-- a:begin -->\nx\n", r"add the line\(s\) <!-- a:end -->"),
    ("<!-- a:begin -->\n<!-- a:begin -->\n<!-- a:end -->\n", "keep one of each of <!-- a:begin"),
    ("x\n<!-- a:end -->\n<!-- a:begin -->\n", r"page.md:2: <!-- a:end --> comes before"),
])
def test_missing_doubled_or_swapped_markers_are_errors(tmp_path, text, message):
    page = tmp_path / "page.md"
    page.write_text(text)
    with pytest.raises(ValueError, match=message):
        replace_section(page, "a", "body")
    assert page.read_text() == text  # nothing written
