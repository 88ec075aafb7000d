"""What `tests/test_docs.py` checks in README.md, apps/*/README.md and docs/*.md against the
repository: each function returns the page's problems as `"page:line: what"` strings.

- `link_problems`: every relative Markdown link points at an existing file, and its
  `#anchor` at a heading of that page (GitHub's heading ids).
- `path_problems`: every repository path named in the text (`training/run_results.py`,
  `tests/test_x.py::test_name`, `training/shakespeare_char_{txl,none,aux}.yaml`,
  `model_<variant>.tflite` patterns) exists, from the repository root or, in an app's
  README, from the app's directory.
- `flag_problems`: every `--flag` on a `keras-attn COMMAND` command line (in code) is an
  option of that command's argparse parser (`keras_attn.cli.build_parser`, no process).
- `name_problems`: every dotted `keras_attn.…` name and every `from keras_attn… import …`
  resolves.
"""

import argparse
import functools
import importlib
import itertools
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted(ROOT.glob("apps/*/README.md")),
         *sorted((ROOT / "docs").glob("*.md"))]
# The repository's top-level source directories: a word followed by one of these and `/`
# names a file of the repository.
SOURCE_DIRECTORIES = ("apps", "benchmarks", "docs", "export", "keras_attn", "tests", "tools",
                      "training")
# Paths the docs name that are built, not committed (git-ignored build outputs).
BUILT = ("apps/web_demo/dist/", "apps/android_demo/app/src/main/assets/")
# Paths that only illustrate, per page: a config error's example output; the module the
# page's example of a new artifact kind would add.
ILLUSTRATIONS = {"docs/training.md": {"training/x.yaml"},
                 "docs/pipeline.md": {"keras_attn/export/artifacts/onnx_fp16_artifact.py"}}

FENCE = re.compile(r"^ {0,3}(```|~~~)[^\n]*\n(.*?)^ {0,3}\1[ \t]*$", re.DOTALL | re.MULTILINE)
INDENTED = re.compile(r"(?:^(?: {4}|\t)[^\n]*\n)+", re.MULTILINE)
INLINE = re.compile(r"(?<!`)`([^`]+?)`(?!`)")
LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", re.MULTILINE)
COMMAND = re.compile(r"(?<![\w./-])keras-attn[ \t]+([a-z][\w-]*)([^\n|;&#]*)")
FLAG = re.compile(r"(?<![\w-])--[A-Za-z][\w-]*")
DOTTED = re.compile(r"(?<![\w./-])keras_attn(?:\.[A-Za-z_]\w*)+")
FROM_IMPORT = re.compile(r"from[ \t]+(keras_attn(?:\.\w+)*)[ \t]+import"
                         r"(?:[ \t]*\(([^)]*)\)|[ \t]+([\w \t,]+))")


def all_problems(page, text=None):
    """Every problem of `page` (its text, or `text` read as if it were at `page`)."""
    text = page.read_text(encoding="utf-8") if text is None else text
    return [*link_problems(page, text), *path_problems(page, text),
            *flag_problems(page, text), *name_problems(page, text)]


def _where(page, text, offset):
    try:
        name = page.relative_to(ROOT)
    except ValueError:
        name = page
    return f"{name}:{text.count(chr(10), 0, offset) + 1}"


def _blank(match):
    return re.sub(r"[^\n]", " ", match.group(0))


def _outside_code(text):
    """`text` with fenced and indented code blocks blanked (same offsets and lines)."""
    return INDENTED.sub(_blank, FENCE.sub(_blank, text))


# --- links ---------------------------------------------------------------------------------


def heading_ids(page):
    """The ids GitHub gives the headings of `page`: lower case, punctuation removed, spaces
    as `-`, a repeated id suffixed `-1`, `-2`, ..."""
    ids, seen = set(), {}
    for match in HEADING.finditer(_outside_code(page.read_text(encoding="utf-8"))):
        title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", match.group(1))  # link text only
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        ids.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return ids


def link_problems(page, text):
    problems = []
    scan = INLINE.sub(lambda m: " " * len(m.group(0)), _outside_code(text))
    for match in LINK.finditer(scan):
        target = match.group(1)
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
            continue
        file, _, anchor = target.partition("#")
        linked = (page.parent / file).resolve() if file else page
        where = _where(page, text, match.start())
        if not linked.exists():
            problems.append(f"{where}: link to a missing file: {target}")
        elif anchor and linked.suffix == ".md" and anchor not in heading_ids(linked):
            problems.append(f"{where}: link to a missing heading: {target}")
    return problems


# --- repository paths ----------------------------------------------------------------------


def _bases(page):
    """Where a path on `page` may start: the root, and an app's directory for its README."""
    bases = [ROOT]
    if page.parent.parent == ROOT / "apps":
        bases.append(page.parent)
    return bases


def _expand(path):
    """Glob patterns of a path naming a family of files (`{a,b}`, `<variant>`, `*`, `…`)."""
    path = re.sub(r"<[^<>/]*>|…|\.\.\.", "*", path)
    brace = re.search(r"\{([^{}]*)\}", path)
    if not brace:
        return [path]
    return list(itertools.chain.from_iterable(
        _expand(path[:brace.start()] + option + path[brace.end():])
        for option in brace.group(1).split(",")))


def _exists(path, bases):
    """Whether every file `path` names exists (each `{a,b}` choice; a pattern: one match)."""
    def one(pattern):
        if any(c in pattern for c in "*?["):
            return any(any(base.glob(pattern)) for base in bases)
        return any((base / pattern).exists() for base in bases)
    return all(one(pattern) for pattern in _expand(path.rstrip("/")))


def _relative(path):
    return (path.resolve().relative_to(ROOT).as_posix() + "/"
            if path.resolve().is_relative_to(ROOT) else str(path))


def _test_exists(file, name):
    source = file.read_text(encoding="utf-8")
    name = name.split("[")[0].split("::")[-1]
    return re.search(rf"^\s*(?:async\s+)?(?:def|class)\s+{re.escape(name)}\b", source,
                     re.MULTILINE) is not None


def path_problems(page, text):
    bases = _bases(page)
    prefixes = set(SOURCE_DIRECTORIES)
    if len(bases) > 1:
        prefixes |= {p.name for p in page.parent.iterdir() if p.is_dir()}
    pattern = re.compile(r"(?<![\w./@:-])(?:%s)/(?:\{[^{}\s]*\}|[^\s`'\")\]|,;{#])*" % "|".join(
        re.escape(p) for p in sorted(prefixes)))
    illustrations = ILLUSTRATIONS.get(page.relative_to(ROOT).as_posix()
                                      if page.is_relative_to(ROOT) else "", set())
    problems = []
    for match in pattern.finditer(text):
        path = match.group(0).rstrip(".:")
        file, _, test = path.partition("::")
        if file in illustrations or any(_relative(base / file).startswith(BUILT)
                                        for base in bases):
            continue
        where = _where(page, text, match.start())
        if not _exists(file, bases):
            problems.append(f"{where}: no such file in the repository: {file}")
        elif test and not _test_exists(next(b / file for b in bases if (b / file).is_file()),
                                       test):
            problems.append(f"{where}: {file} has no test {test}")
    return problems


# --- keras-attn command lines --------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def command_options():
    """`{command: set of its option strings}` of `keras-attn`'s parser (with `--help`)."""
    from keras_attn.cli import build_parser

    parser = build_parser()
    commands = next(action for action in parser._actions
                    if isinstance(action, argparse._SubParsersAction)).choices
    return {name: set(sub._option_string_actions) for name, sub in commands.items()}


def _code_regions(text):
    """`(offset, code)` of every fenced block (continuation lines joined) and inline span
    (line breaks as spaces)."""
    for match in FENCE.finditer(text):
        yield match.start(2), re.sub(r"\\\n", "  ", match.group(2))
    for match in INDENTED.finditer(text):
        yield match.start(), re.sub(r"\\\n", "  ", match.group(0))
    for match in INLINE.finditer(_outside_code(text)):
        yield match.start(1), match.group(1).replace("\n", " ")


def flag_problems(page, text):
    options = command_options()
    problems = []
    for offset, code in _code_regions(text):
        for match in COMMAND.finditer(code):
            command, rest = match.groups()
            where = _where(page, text, offset + match.start())
            if command not in options:
                problems.append(f"{where}: keras-attn has no command {command!r}")
                continue
            for flag in FLAG.findall(rest):
                if flag not in options[command]:
                    problems.append(f"{where}: `keras-attn {command}` has no option {flag} "
                                    f"(keras-attn {command} --help)")
    return problems


# --- Python names --------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def resolves(dotted):
    """Whether `keras_attn.a.b.C` names a module or an attribute of one."""
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        module = ".".join(parts[:split])
        try:
            obj = importlib.import_module(module)
        except ModuleNotFoundError as error:
            if not module.startswith(error.name or module):
                raise  # the module exists, one of its own imports (a dependency) is missing
            continue
        for part in parts[split:]:
            if not hasattr(obj, part):
                return False
            obj = getattr(obj, part)
        return True
    return False


def name_problems(page, text):
    problems = []
    for match in DOTTED.finditer(text):
        if not resolves(match.group(0)):
            problems.append(f"{_where(page, text, match.start())}: {match.group(0)} does not "
                            "import")
    for match in FROM_IMPORT.finditer(text):
        module, names = match.group(1), match.group(2) or match.group(3)
        for name in (part.split()[0] for part in names.split(",") if part.split()):
            if not resolves(f"{module}.{name}"):
                problems.append(f"{_where(page, text, match.start())}: from {module} import "
                                f"{name} fails")
    return problems
