"""Every ```python block of README.md and docs/*.md runs (blocks of one page share state);
every link, repository path, `keras-attn` flag and `keras_attn` name on README.md,
apps/*/README.md and docs/*.md exists (`tests/docs_check.py`), and the check reports each
kind of stale reference planted in a copy of a page."""

import pathlib
import re

import pytest

from tests import docs_check

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
# Pages whose snippets take 50-60 s on 2 cores (several exports, model families): slow stage.
SLOW_PAGES = ("export.md", "models.md")
SNIPPET_PAGES = [pytest.param(page, marks=pytest.mark.slow if page.name in SLOW_PAGES else ())
                 for page in PAGES]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def python_blocks(page):
    text = page.read_text(encoding="utf-8")
    return [(text[: m.start()].count("\n") + 2, m.group(1)) for m in BLOCK.finditer(text)]


# The pages show the TensorFlow workflow (tf.function, SavedModel, TFLite): default backend.
@pytest.mark.tensorflow
@pytest.mark.parametrize("page", SNIPPET_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_page_snippets_run(page, tmp_path, monkeypatch):
    blocks = python_blocks(page)
    if not blocks:
        pytest.skip(f"{page.name} has no python blocks")
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": f"docs_{page.stem}"}
    for line, source in blocks:
        code = compile(source, f"{page.relative_to(ROOT)}:{line}", "exec")
        exec(code, namespace)  # noqa: S102 - running our own documentation is the point


# --- every link, path, keras-attn flag and Python name of the pages exists -----------------


@pytest.mark.tensorflow  # the names import keras_attn.export / inference
@pytest.mark.parametrize("page", docs_check.PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_page_names_only_what_exists(page):
    assert docs_check.all_problems(page) == []


def test_the_check_reads_every_page_and_finds_what_it_checks():
    """Not vacuous: the pages hold links, repository paths and keras-attn command lines."""
    assert {"README.md", "apps/android_demo/README.md", "docs/pipeline.md", "docs/api.md"} <= {
        str(p.relative_to(ROOT)) for p in docs_check.PAGES}
    text = (ROOT / "docs" / "export.md").read_text(encoding="utf-8")
    commands = [m.group(1) for _, code in docs_check._code_regions(text)
                for m in docs_check.COMMAND.finditer(code)]
    assert commands.count("export") > 5
    assert len(docs_check.LINK.findall((ROOT / "README.md").read_text(encoding="utf-8"))) > 5


PAGE = ROOT / "docs" / "training.md"  # any page: the stale reference is appended to a copy


def planted(tmp_path, stale):
    """`(page, text)`: a temporary copy of docs/training.md with the line `stale` appended,
    read as if it were the page itself (its links and paths resolve from docs/)."""
    copy = tmp_path / PAGE.name
    copy.write_text(PAGE.read_text(encoding="utf-8") + "\n" + stale + "\n", encoding="utf-8")
    return PAGE, copy.read_text(encoding="utf-8")


def reported(problems, text):
    """The problems without their `page:line: `, after checking they are on the last line."""
    last = text.rstrip("\n").count("\n") + 1
    assert all(p.startswith(f"docs/training.md:{last}: ") for p in problems), problems
    return [p.split(": ", 1)[1] for p in problems]


@pytest.mark.parametrize("stale, expected", [
    ("See `training/run_all_results.py`.",
     "no such file in the repository: training/run_all_results.py"),
    ("Run training/shakespeare_char_{none,aux,gru}.yaml.",
     "no such file in the repository: training/shakespeare_char_{none,aux,gru}.yaml"),
    ("See `tests/test_run_results.py::test_no_such_test`.",
     "tests/test_run_results.py has no test test_no_such_test"),
    ("See [the results](result.md).", "link to a missing file: result.md"),
    ("See [the web page](benchmarks.md#web-browsers).",
     "link to a missing heading: benchmarks.md#web-browsers"),
])
def test_a_stale_path_or_link_is_reported(tmp_path, stale, expected):
    page, text = planted(tmp_path, stale)
    problems = docs_check.path_problems(page, text) + docs_check.link_problems(page, text)
    assert reported(problems, text) == [expected]


@pytest.mark.parametrize("stale, expected", [
    ("`keras-attn train training/sst2_minilm.yaml --num-epochs 1`",
     "`keras-attn train` has no option --num-epochs (keras-attn train --help)"),
    ("`keras-attn export runs/sst2 --float-residual`",
     "`keras-attn export` has no option --float-residual (keras-attn export --help)"),
    ("`keras-attn expor runs/sst2`", "keras-attn has no command 'expor'"),
])
def test_a_stale_flag_or_command_is_reported(tmp_path, stale, expected):
    page, text = planted(tmp_path, stale)
    assert reported(docs_check.flag_problems(page, text), text) == [expected]


@pytest.mark.tensorflow
@pytest.mark.parametrize("stale, expected", [
    ("`keras_attn.runs.RunFolder`", ["keras_attn.runs.RunFolder does not import"]),
    ("`from keras_attn.export.mediapipe import append_softmax`",
     ["keras_attn.export.mediapipe does not import",
      "from keras_attn.export.mediapipe import append_softmax fails"]),
])
def test_a_stale_python_name_is_reported(tmp_path, stale, expected):
    page, text = planted(tmp_path, stale)
    assert reported(docs_check.name_problems(page, text), text) == expected
