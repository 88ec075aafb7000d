"""Writes keras-attn's BERT text tables (`bert_text_tables.txt`): the answers of the reference
tokenizer, HF `tokenizers`' BERT normalizer and pre-tokenizer, for every code point, so that the
Python tokenizer (in-graph), the Kotlin core and the JS core need no Unicode data of their own.

Usage: python tools/make_text_tables.py [OUT_FILE]
(default: `keras_attn/text/bert_text_tables.txt`, the one copy in the repository: the Python
library reads it as package data, the web core imports it, and the Android core's build copies
it onto its class path as the resource `dev/kerasattn/core/bert_text_tables.txt`).

Why tables: the reference is HF `tokenizers`' `BertNormalizer` + `BertPreTokenizer` (what
MiniLM / BERT were pretrained with). It follows the Unicode data of its Rust crates (older than
Python 3.11's Unicode 14.0 for categories: U+061D, U+2E55-2E5D and 92 other recent punctuation
characters are letters to it; recent nonspacing marks are kept), keeps unassigned code points,
and its CJK ranges read U+2B920 where BERT's Python code has U+2B820. Java, JavaScript, ICU and
Python each know another Unicode version, and the JVM and JS have no `BertNormalizer`. So the
generator asks the reference about every code point and writes down the answers. The
normalizer works character by character (checked here on every code point: the whole
normalizer equals the composition of its steps applied to each character alone):

- `normalize_uncased` / `normalize_cased`: what `BertNormalizer(lowercase=True)` (clean text,
  NFD, drop nonspacing marks, lower-case) / `BertNormalizer(lowercase=False)` (clean text
  only) make of each code point, CJK padding left out (the `P` class below covers it).
  Only changed code points are listed:
  `R start count step delta` (code points start, start+step, ... map to themselves + delta),
  `T start count step target` (... all map to `target`), `E start count step` (... are
  removed), `M cp out...` (several code points out), `H first last` (Hangul syllables,
  decomposed by the Unicode algorithm, checked here against the reference).
- `normalize_lowercase` / `normalize_strip_accents`: the two steps alone (for the mixed modes
  of the Python tokenizer: lower-case without stripping accents and the reverse); applied to
  the output of `normalize_cased`.
- `tokenizer_classes`: how a character of normalized text is pre-tokenized: `W` part of a
  word, `S` whitespace, `P` a word of its own (punctuation, or a CJK ideograph, which the
  normalizer pads with spaces). Run-length lines `C start class`.
- `word_classes_strip_accents` / `word_classes_keep_accents`: `keras_attn.text.word_splitter`
  classes (`W` word, `S` whitespace, `R` removed, `P` single-character word), run-length.

All numbers in hex except `count`, `step` and `delta`. The file is regenerated and compared by
`tests/test_golden_vectors.py`, so a `tokenizers` or Python upgrade that changes an answer
fails there.
"""

import pathlib
import sys

MAX_CODE_POINT = 0x10FFFF
HANGUL_FIRST, HANGUL_LAST = 0xAC00, 0xD7A3
REPOSITORY = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_OUTPUT = REPOSITORY / "keras_attn" / "text" / "bert_text_tables.txt"


def _code_points():
    return [c for c in range(MAX_CODE_POINT + 1) if not 0xD800 <= c <= 0xDFFF]


def hangul_nfd(code):
    """The canonical decomposition of a precomposed Hangul syllable (Unicode §3.12)."""
    index = code - HANGUL_FIRST
    lead, vowel, trail = 0x1100 + index // 588, 0x1161 + (index % 588) // 28, index % 28
    return [lead, vowel] + ([0x11A7 + trail] if trail else [])


def _bert_normalizer(clean_text=False, chinese=False, strip_accents=False, lowercase=False):
    from tokenizers import normalizers

    return normalizers.BertNormalizer(clean_text=clean_text, handle_chinese_chars=chinese,
                                      strip_accents=strip_accents, lowercase=lowercase)


def reference_step_outputs():
    """Per code point, the output of each step of HF's `BertNormalizer` on that character alone.

    Returns:
        dict of step name (`"cased"`, `"strip_accents"`, `"lowercase"`, `"uncased"`) to a list
        of str, one per code point of `_code_points()`; `"uncased"` is the whole normalizer
        (CJK padding removed), checked to equal the composition of the steps.
    """
    codes = _code_points()
    steps = {
        "cased": _bert_normalizer(clean_text=True),
        "strip_accents": _bert_normalizer(strip_accents=True),
        "lowercase": _bert_normalizer(lowercase=True),
        "uncased": _bert_normalizer(clean_text=True, chinese=True, strip_accents=True,
                                    lowercase=True),
    }
    outputs = {name: [step.normalize_str(chr(c)) for c in codes] for name, step in steps.items()}
    chinese = _bert_normalizer(chinese=True)
    for index, code in enumerate(codes):
        character = chr(code)
        if chinese.normalize_str(character) != character:
            whole = outputs["uncased"][index]
            if whole[:1] != " " or whole[-1:] != " ":
                raise RuntimeError(f"U+{code:04X}: CJK padding is not one space each side")
            outputs["uncased"][index] = whole[1:-1]
        composed = "".join(
            "".join(outputs["lowercase"][_index(ord(x))] for x in outputs["strip_accents"][
                _index(ord(y))]) for y in outputs["cased"][index])
        if composed != outputs["uncased"][index]:
            raise RuntimeError(f"U+{code:04X}: the uncased normalizer is not the composition of "
                               "its steps; the table format needs a change")
    return outputs


def _index(code):
    """Position of a code point in `_code_points()` (surrogates are skipped)."""
    return code if code < 0xD800 else code - 0x800


def normalization_lines(outputs):
    """`R` / `T` / `E` / `M` / `H` lines of one step's per-code-point outputs."""
    codes = _code_points()
    singles, lines = [], []
    first = _index(HANGUL_FIRST)
    hangul = range(HANGUL_FIRST, HANGUL_LAST + 1)
    hangul_changed = [outputs[first + i] != chr(c) for i, c in enumerate(hangul)]
    if any(hangul_changed):
        for i, code in enumerate(hangul):
            if [ord(ch) for ch in outputs[first + i]] != hangul_nfd(code):
                raise RuntimeError(f"U+{code:04X}: the reference does not decompose Hangul "
                                   "by the Unicode algorithm; the table format needs a change")
        lines.append(f"H {HANGUL_FIRST:X} {HANGUL_LAST:X}")
    for code, output in zip(codes, outputs):
        if output == chr(code) or (any(hangul_changed) and HANGUL_FIRST <= code <= HANGUL_LAST):
            continue
        if len(output) == 1:
            singles.append((code, ord(output)))
        elif output:
            lines.append(" ".join(["M", f"{code:X}"] + [f"{ord(ch):X}" for ch in output]))
    lines += _runs(singles, "RT")
    lines += _runs([(code, None) for code, output in zip(codes, outputs) if output == ""], "E")
    return sorted(lines, key=lambda line: (line[0] != "H", int(line.split()[1], 16)))


RUN_KINDS = {
    "R": lambda code, target: target - code,  # R start count step delta
    "T": lambda code, target: target,  # T start count step target
    "E": lambda code, target: None,  # E start count step (removed)
}


def _runs(mappings, letters):
    """Run-length lines of sorted `(code, target)` pairs: at each point the kind of `letters`
    (see `RUN_KINDS`) whose key stays constant over the most following pairs, with a constant
    step between code points."""
    lines = []
    index = 0
    while index < len(mappings):
        best = None
        for letter in letters:
            key = RUN_KINDS[letter]
            count, step = 1, None
            first = key(*mappings[index])
            while index + count < len(mappings):
                code, target = mappings[index + count]
                gap = code - mappings[index + count - 1][0]
                if key(code, target) != first or (step is not None and gap != step):
                    break
                step = gap
                count += 1
            if best is None or count > best[1]:
                best = (letter, count, step or 1, first)
        letter, count, step, value = best
        start = mappings[index][0]
        value = "" if letter == "E" else f" {value:X}" if letter == "T" else f" {value}"
        lines.append(f"{letter} {start:X} {count} {step}{value}")
        index += count
    return lines


def tokenizer_class_lines():
    """`C` lines: how HF's `BertPreTokenizer` (and the normalizer's CJK padding) treats each
    character of normalized text."""
    from tokenizers import pre_tokenizers

    pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    chinese = _bert_normalizer(chinese=True)
    classes = {}
    for code in _code_points():
        character = chr(code)
        # "a?b": a separator gives [a, b], a word of its own [a, ?, b], a letter [a?b].
        words = tuple(word for word, _ in pre_tokenizer.pre_tokenize_str(f"a{character}b"))
        kind = {("a", "b"): "S", ("a", character, "b"): "P", (f"a{character}b",): "W"}.get(words)
        if kind is None:
            raise RuntimeError(f"U+{code:04X}: unexpected pre-tokenization {words}")
        if chinese.normalize_str(character) != character:
            if kind != "W":
                raise RuntimeError(f"U+{code:04X}: a CJK character that is not a letter")
            kind = "P"
        classes[code] = kind
    return _run_length(classes)


def word_class_lines(strip_accents):
    """`C` lines of `keras_attn.text.word_splitter` classes."""
    from keras_attn.text.word_splitter import character_class_table

    letters = "WSRP"  # WORD_CHARACTER, WHITESPACE, REMOVED, SINGLE_CHARACTER_WORD
    starts, classes = character_class_table(strip_accents)
    return [f"C {int(s):X} {letters[int(k)]}" for s, k in zip(starts, classes)]


def _run_length(classes):
    lines, previous = [], None
    for code in range(MAX_CODE_POINT + 1):
        kind = classes.get(code, "W")  # surrogates: never in UTF-8 text
        if kind != previous:
            lines.append(f"C {code:X} {kind}")
            previous = kind
    return lines


def table_text():
    """The whole file as a str."""
    import tokenizers

    outputs = reference_step_outputs()
    sections = [
        ("normalize_uncased", normalization_lines(outputs["uncased"])),
        ("normalize_cased", normalization_lines(outputs["cased"])),
        ("normalize_lowercase", normalization_lines(outputs["lowercase"])),
        ("normalize_strip_accents", normalization_lines(outputs["strip_accents"])),
        ("tokenizer_classes", tokenizer_class_lines()),
        ("word_classes_strip_accents", word_class_lines(True)),
        ("word_classes_keep_accents", word_class_lines(False)),
    ]
    header = [
        "# BERT text tables of keras-attn's tokenizers (Python, Kotlin, JS). Generated by",
        "# tools/make_text_tables.py from HF tokenizers "
        f"{tokenizers.__version__} and Python {sys.version_info.major}.{sys.version_info.minor} "
        "unicodedata;",
        "# the format is in that script's docstring. Regenerate instead of editing.",
    ]
    lines = list(header)
    for name, body in sections:
        lines.append(f"table {name} {len(body)}")
        lines.extend(body)
    lines.append("end")
    return "\n".join(lines) + "\n"


def main(argv):
    if len(argv) > 1:
        sys.exit("usage: make_text_tables.py [OUT_FILE]")
    out = pathlib.Path(argv[0]) if argv else DEFAULT_OUTPUT
    text = table_text()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="ascii")
    print(f"wrote {out} ({len(text.splitlines())} lines, {len(text.encode()):,} bytes)")


if __name__ == "__main__":
    main(sys.argv[1:])
