"""Writes the Unicode tables of the Kotlin tokenizer (`bert_text_tables.txt`), measured from
the Python reference itself, so the phone needs no Unicode data of its own.

Usage: python apps/android_demo/tools/make_text_tables.py [OUT_FILE]
(default: the core module's resource `dev/kerasattn/core/bert_text_tables.txt`).

Why tables: the reference tokenizer is tensorflow-text's `FastBertTokenizer`, whose normalizer
maps every code point on its own through ICU (NFKC case folding, NFD, accent removal, control
characters to spaces), and the NER word splitter uses Python's `unicodedata` (Unicode 14.0).
Java's `Character` and `java.text.Normalizer` know other Unicode versions (and Android's
depend on the OS release), and the JVM has no case folding ("ß" -> "ss"). So the generator
asks the reference about every code point and writes down the answers:

- `normalize_uncased` / `normalize_cased`: what `FastBertNormalizer` makes of each code point
  (with and without `lower_case_nfd_strip_accents`). Only changed code points are listed:
  `R start count step delta` (code points start, start+step, ... map to themselves + delta),
  `T start count step target` (... all map to `target`), `E start count step` (... are
  removed), `M cp out...` (several code points out), `H first last` (Hangul syllables,
  decomposed by the Unicode algorithm, checked here against the reference).
- `tokenizer_classes`: how `FastWordpieceTokenizer` treats each character of normalized text:
  `W` part of a word, `S` whitespace, `P` a word of its own (punctuation, CJK). Run-length
  lines `C start class`.
- `word_classes_strip_accents` / `word_classes_keep_accents`: `keras_attn.text.word_splitter`
  classes (`W` word, `S` whitespace, `R` removed, `P` single-character word), run-length.

All numbers in hex except `count`, `step` and `delta`. The file is regenerated and compared by
`tests/test_golden_vectors.py`, so a tensorflow-text or Python upgrade that changes an answer
fails there.
"""

import pathlib
import sys

MAX_CODE_POINT = 0x10FFFF
HANGUL_FIRST, HANGUL_LAST = 0xAC00, 0xD7A3
DEFAULT_OUTPUT = (pathlib.Path(__file__).resolve().parents[1] / "core" / "src" / "main" /
                  "resources" / "dev" / "kerasattn" / "core" / "bert_text_tables.txt")


def _code_points():
    return [c for c in range(MAX_CODE_POINT + 1) if not 0xD800 <= c <= 0xDFFF]


def hangul_nfd(code):
    """The canonical decomposition of a precomposed Hangul syllable (Unicode §3.12)."""
    index = code - HANGUL_FIRST
    lead, vowel, trail = 0x1100 + index // 588, 0x1161 + (index % 588) // 28, index % 28
    return [lead, vowel] + ([0x11A7 + trail] if trail else [])


def normalization_lines(lowercase):
    """`R` / `M` / `H` lines of `FastBertNormalizer(lower_case_nfd_strip_accents=lowercase)`."""
    import tensorflow as tf
    import tensorflow_text as tf_text

    codes = _code_points()
    normalizer = tf_text.FastBertNormalizer(lower_case_nfd_strip_accents=lowercase)
    outputs = [o.decode("utf-8") for o in
               normalizer.normalize(tf.constant([chr(c) for c in codes])).numpy()]
    singles, lines = [], []
    hangul = [c for c in range(HANGUL_FIRST, HANGUL_LAST + 1)]
    hangul_changed = [outputs[codes.index(HANGUL_FIRST) + i] != chr(c)
                      for i, c in enumerate(hangul)]
    if any(hangul_changed):
        first = codes.index(HANGUL_FIRST)
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
    """`C` lines: how `FastWordpieceTokenizer` pre-tokenizes each (normalized) character."""
    import tensorflow as tf
    import tensorflow_text as tf_text

    codes = _code_points()
    tokenizer = tf_text.FastWordpieceTokenizer(
        ["a", "##a", "[UNK]"], suffix_indicator="##", unknown_token="[UNK]",
        no_pretokenization=False, token_out_type=tf.string, support_detokenization=False)
    # "a?a": a separator gives [a, a], a word of its own [a, UNK, a], a letter [UNK].
    pieces = tokenizer.tokenize(tf.constant(["a" + chr(c) + "a" for c in codes])).to_list()
    kinds = {("a", "a"): "S", ("a", "[UNK]", "a"): "P", ("[UNK]",): "W", ("a", "##a", "##a"): "W"}
    classes = {}
    for code, row in zip(codes, pieces):
        key = tuple(p.decode() for p in row)
        if key not in kinds or (key == ("a", "##a", "##a")) != (code == ord("a")):
            raise RuntimeError(f"U+{code:04X}: unexpected pre-tokenization {key}")
        classes[code] = kinds[key]
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
    import tensorflow_text as tf_text

    sections = [
        ("normalize_uncased", normalization_lines(True)),
        ("normalize_cased", normalization_lines(False)),
        ("tokenizer_classes", tokenizer_class_lines()),
        ("word_classes_strip_accents", word_class_lines(True)),
        ("word_classes_keep_accents", word_class_lines(False)),
    ]
    header = [
        "# BERT text tables of keras-attn's Kotlin tokenizer. Generated by",
        "# apps/android_demo/tools/make_text_tables.py from tensorflow-text "
        f"{tf_text.__version__} and Python {sys.version_info.major}.{sys.version_info.minor} "
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
    out.parent.mkdir(parents=True, exist_ok=True)
    text = table_text()
    out.write_text(text, encoding="ascii")
    print(f"wrote {out} ({len(text.splitlines())} lines, {len(text.encode()):,} bytes)")


if __name__ == "__main__":
    main(sys.argv[1:])
