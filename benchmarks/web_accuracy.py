"""A whole evaluation set through the web page and through Python LiteRT, on one file.

Usage:
    python benchmarks/web_accuracy.py EXPORT_DIR --data sst2|conll2003|golden
        [--file model_int8_buckets.tflite] [--labels 0=negative,1=positive] [--limit N]
        [--out FILE.md] [--differences FILE.jsonl]

Texts: SST-2 dev sentences, CoNLL-2003 test sentences as their tokens joined by spaces, or
(`golden`) the export's `golden_vectors.jsonl` texts that are one non-blank line (no gold
labels: no metric). Python's
side is `apps/web_demo/tools/python_reference.py` on the file (`load_predictor(file)`, the code
of `keras-attn predict --json`, one text per call, with the logits), the page's
`apps/web_demo/tools/page_predict.mjs FILE TEXTS --logits` (the built library on LiteRT.js in
headless Chromium). Reports for both the accuracy (classification, gold labels mapped with
`--labels` where the model's names differ from the data's) or the strict entity F1 (each
CoNLL token tagged with the tag of the word that starts where it starts, `entity_scores`), and
for the page how many texts get the same answer (label, or entities and word tags), how many
bit-identical logits, the largest logit move in int8 steps and the largest probability
difference (per label, per token for a tagger). `--differences` writes the texts whose
logits or answer differ, with both sides.

Exits 1 when the page breaks the parity rules. A file whose logits are dequantized from int8
must keep the rules of `apps/web_demo/e2e/parity_rules.json` (the browser test applies the
same, `apps/web_demo/e2e/parity.ts`; docs/web.md says why): bit-identical logits on at least
`min_bit_identical` of the texts, no logit more than `max_steps` int8 steps from Python's, the
same rows, and an answer that changes only on a row (a token, for a tagger) whose Python top-two
margin is below `near_tie_steps` steps. A float file must give the same answer on every text.
Data is read in place from `../shared/data` (`KERAS_ATTN_SHARED_DATA`).
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import numpy as np

from keras_attn.text.classification_reader import ClassificationReader
from keras_attn.text.conll_reader import ConllReader
from keras_attn.text.ner import entity_scores

REPO = pathlib.Path(__file__).resolve().parents[1]
WEB = REPO / "apps" / "web_demo"
RULES = WEB / "e2e" / "parity_rules.json"
sys.path.insert(0, str(WEB / "tools"))
from python_reference import file_reference  # noqa: E402
from python_reference import golden_texts  # noqa: E402
from python_reference import output_step  # noqa: E402


def shared_data():
    root = os.environ.get("KERAS_ATTN_SHARED_DATA")
    return pathlib.Path(root) if root else REPO.parent / "shared" / "data"


def load_set(name, limit=None, export_dir=None):
    """`(texts, gold)`: labels (SST-2 dev), `(tokens, tags)` pairs (CoNLL-2003 test), or the
    golden texts of `export_dir` that are one non-blank line (`page_predict.mjs` reads lines;
    the browser test runs the others) with `gold` None."""
    if name == "golden":
        return [t for t in golden_texts(export_dir) if single_line(t)][:limit], None
    if name == "sst2":
        reader = ClassificationReader(shared_data() / "sst2" / "dev.tsv",
                                      text_column="sentence", label_column="label")
        examples = list(reader)[:limit]
        return [e.text for e in examples], [str(e.label) for e in examples]
    sentences = list(ConllReader(shared_data() / "conll2003" / "test.txt"))[:limit]
    return [" ".join(s.tokens) for s in sentences], [(s.tokens, s.tags) for s in sentences]


def single_line(text):
    """A text `page_predict.mjs` reads back as it is: non-blank, no `\n` or `\r`."""
    return bool(text.strip()) and "\n" not in text and "\r" not in text


def token_tags(tokens, words):
    """The tag of each whitespace token: that of the predicted word starting where it starts."""
    starts = {word["start"]: word["tag"] for word in words}
    tags, at = [], 0
    for token in tokens:
        tags.append(starts.get(at, "O"))
        at += len(token) + 1
    return tags


def score(name, results, gold, label_map):
    if name == "sst2":
        correct = sum(label_map.get(g, g) == r["label"] for r, g in zip(results, gold))
        return {"accuracy": correct / len(gold)}
    predicted = [token_tags(tokens, r["words"]) for r, (tokens, _) in zip(results, gold)]
    return {"f1": entity_scores([tags for _, tags in gold], predicted)["f1"]}


def same(a, b):
    """The same answer: the label, or the entities, words and word tags."""
    if "label" in a:
        return a["label"] == b["label"]
    return (a["entities"], a["words"], a["num_truncated_words"]) == \
        (b["entities"], b["words"], b["num_truncated_words"])


def load_rules(path=RULES):
    """The parity rules: `min_bit_identical`, `max_steps`, `near_tie_steps`."""
    rules = json.loads(pathlib.Path(path).read_text("utf-8"))
    return {key: rules[key] for key in ("min_bit_identical", "max_steps", "near_tie_steps")}


def rows(logits):
    """Logits as a float64 `(n, C)` array: a classifier's `(C,)` is one row."""
    array = np.asarray(logits, dtype=np.float64)
    return array.reshape(0, 0) if array.size == 0 else array.reshape(-1, array.shape[-1])


def softmax_rows(logits):
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def probability_difference(a, b):
    """The largest |p_a - p_b| over every row (one per token for a tagger) and label of two
    logits (`inf` when their shapes differ)."""
    a, b = rows(a), rows(b)
    if a.shape != b.shape:
        return float("inf")
    return float(np.abs(softmax_rows(a) - softmax_rows(b)).max(initial=0.0))


def in_steps(value, step):
    """`value / step` to 1e-3: values on one int8 grid are whole steps apart, up to float
    error."""
    return round(float(value) / step, 3)


def margin_steps(row, step):
    """The top-two margin of one row of logits, in int8 steps (inf for one label)."""
    top = np.sort(np.asarray(row, dtype=np.float64))[::-1]
    return float("inf") if len(top) < 2 else in_steps(top[0] - top[1], step)


def text_parity(text, python, page, step, rules):
    """One text's `python` and `page` outputs (`{"logits", "result"}`) against the rules:
    `{"identical", "steps", "same_answer", "flips": [(row, margin)], "failures"}`."""
    expected, got = rows(python["logits"]), rows(page["logits"])
    verdict = {"identical": False, "steps": float("inf"), "flips": [], "failures": [],
               "same_answer": same(python["result"], page["result"])}
    if expected.shape != got.shape:
        verdict["failures"].append(f"{text!r}: Python gave {expected.shape} logits, the page "
                                   f"{got.shape} (a token dropped or added)")
        return verdict
    difference = np.abs(expected - got)
    verdict["identical"] = bool((difference == 0).all())
    verdict["steps"] = in_steps(difference.max(initial=0.0), step)
    flipped = np.flatnonzero(expected.argmax(axis=-1) != got.argmax(axis=-1))
    verdict["flips"] = [(int(i), margin_steps(expected[i], step)) for i in flipped]
    if not verdict["steps"] <= rules["max_steps"]:
        verdict["failures"].append(f"{text!r}: a logit moved {verdict['steps']:.2f} int8 steps "
                                   f"(at most {rules['max_steps']})")
    verdict["failures"] += [
        f"{text!r}: row {row} changed its answer where Python's top two are {margin:.2f} steps "
        f"apart (a near-tie is below {rules['near_tie_steps']})"
        for row, margin in verdict["flips"] if not margin < rules["near_tie_steps"]]
    if not verdict["same_answer"] and not verdict["flips"]:
        verdict["failures"].append(f"{text!r}: another answer with the same argmax on every "
                                   "row (decoding or tokenization differs)")
    return verdict


def int8_parity(texts, python, page, step, rules):
    """Every text of an int8 file against the rules (`apps/web_demo/e2e/parity.ts`'s
    `int8Parity`, in Python).

    Args:
        texts: list of str.
        python: Python's `{"logits", "result"}` per text.
        page: the page's `{"logits", "result"}` per text.
        step: float, the scale of the int8 tensor the logits are dequantized from.
        rules: dict, `load_rules()`.

    Returns:
        `{"texts", "identical", "same_answer", "max_steps", "per_text", "failures"}`.

    Example:
    >>> one = {"logits": [0.0, 1.0], "result": {"label": "b"}}
    >>> int8_parity(["t"], [one], [one], 0.5, load_rules())["failures"]
    []
    """
    if not len(texts) == len(python) == len(page):
        raise ValueError(f"int8_parity needs one Python and one page output per text: "
                         f"{len(texts)} texts, {len(python)} Python, {len(page)} page outputs. "
                         f"Received: len(texts)={len(texts)}")
    if not (step or 0) > 0:
        raise ValueError("int8_parity needs the output's int8 scale, a positive number "
                         f"(python_reference.output_step). Received: step={step}")
    per_text = [text_parity(t, a, b, step, rules) for t, a, b in zip(texts, python, page)]
    identical = sum(v["identical"] for v in per_text)
    failures = [failure for v in per_text for failure in v["failures"]]
    if identical < rules["min_bit_identical"] * len(texts):
        failures.append(f"bit-identical logits on {identical} of {len(texts)} texts, below "
                        f"{rules['min_bit_identical']:.0%}")
    return {"texts": len(texts), "identical": identical, "per_text": per_text,
            "same_answer": sum(v["same_answer"] for v in per_text), "failures": failures,
            "max_steps": max((v["steps"] for v in per_text), default=0.0)}


def float_parity(texts, python, page):
    """A float file's rule: the same answer on every text; the failures, one line each."""
    return [f"{t!r}: Python answered {a['result']}, the page {b['result']}"
            for t, a, b in zip(texts, python, page) if not same(a["result"], b["result"])]


def run(command, cwd=None):
    """`command`'s standard output; its error output in the message when it fails."""
    done = subprocess.run(command, capture_output=True, text=True, cwd=cwd)
    if done.returncode != 0:
        raise SystemExit(f"error: {' '.join(command[:3])} ... exited {done.returncode}:\n"
                         f"{done.stderr[-2000:]}")
    return done.stdout


def run_routes(model, texts):
    """`(python, page)`: `{"logits", "result"}` per text from Python LiteRT and the page."""
    model = pathlib.Path(model).resolve()
    _, python = file_reference(model, texts)
    with tempfile.TemporaryDirectory() as tmp:
        texts_path = pathlib.Path(tmp) / "texts.txt"
        texts_path.write_text("\n".join(texts) + "\n", encoding="utf-8")
        out = run(["node", str(WEB / "tools" / "page_predict.mjs"), str(model),
                   str(texts_path), "--logits"], cwd=WEB)
    page = []
    for line in filter(str.strip, out.split("\n")):  # not splitlines: U+2028 is in texts
        record = json.loads(line)
        logits = record.pop("logits")
        page.append({"logits": logits, "result": {k: v for k, v in record.items()
                                                   if k not in ("line", "text")}})
    return python, page


def evaluate(model, texts, rules):
    """Both routes on `texts` and the verdict: `{"python", "page", "step", "parity",
    "moved", "failures"}` (`parity` None for a float file, `moved` the largest |Δp|)."""
    if not all(map(single_line, texts)):
        raise SystemExit("error: the texts must be non-blank single lines (page_predict.mjs "
                         "reads one text per line and skips blank ones)")
    python, page = run_routes(model, texts)
    if len(page) != len(texts):
        raise SystemExit(f"error: {len(texts)} texts, the page gave {len(page)} results")
    step = output_step(model)
    parity = None if step is None else int8_parity(texts, python, page, step, rules)
    return {"python": python, "page": page, "step": step, "parity": parity,
            "failures": float_parity(texts, python, page) if parity is None
            else parity["failures"],
            "moved": max(probability_difference(a["logits"], b["logits"])
                         for a, b in zip(python, page))}


def largest_difference(python, page):
    """The largest |Δlogit| over pairs of outputs (`inf` where their shapes differ)."""
    def difference(a, b):
        x, y = rows(a["logits"]), rows(b["logits"])
        return float(np.abs(x - y).max(initial=0.0)) if x.shape == y.shape else float("inf")
    return max((difference(a, b) for a, b in zip(python, page)), default=0.0)


def identical(a, b):
    """Bit-identical logits and the same answer."""
    x, y = rows(a["logits"]), rows(b["logits"])
    return x.shape == y.shape and bool((x == y).all()) and same(a["result"], b["result"])


def metric(data, outputs, gold, label_map):
    """`"accuracy 0.7534"` or `"f1 0.4652"` of one route's outputs (empty without gold)."""
    if gold is None:
        return ""
    (name, value), = score(data, [o["result"] for o in outputs], gold, label_map).items()
    return f"{name} {value:.4f}"


def report(title, outcome, metrics):
    """The markdown report of `evaluate`'s outcome, `metrics` `{route: metric}`."""
    python, page, parity = outcome["python"], outcome["page"], outcome["parity"]
    agree = sum(same(a["result"], b["result"]) for a, b in zip(python, page))
    alike = sum(identical(a, b) for a, b in zip(python, page))
    moved = f"{largest_difference(python, page):.1e}"
    if parity is not None:
        steps = parity["max_steps"]
        moved = f"{steps:g} int8 step{'' if steps == 1 else 's'} ({moved})"
    n = len(python)
    lines = [title, "", "| route | metric | same answer as Python | bit-identical logits | "
             "max \\|Δlogit\\| | max \\|Δp\\| |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for route, value in metrics.items():
        cells = (f"{agree:,} / {n:,} | {alike:,} / {n:,} | {moved} | "
                 f"{outcome['moved']:.1e}") if route.startswith("page") else " |  |  | "
        lines.append(f"| {route} | {value} | {cells} |")
    failures = outcome["failures"]
    lines += ["", "parity rules kept" if not failures else
              f"parity rules broken ({len(failures)}):", *failures[:20]]
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("export_dir", type=pathlib.Path)
    parser.add_argument("--data", choices=("sst2", "conll2003", "golden"), required=True)
    parser.add_argument("--file", default="model_int8_buckets.tflite")
    parser.add_argument("--labels", default="", help="gold=model label pairs, comma separated")
    parser.add_argument("--limit", type=int)
    parser.add_argument("--out", type=pathlib.Path)
    parser.add_argument("--differences", type=pathlib.Path)
    args = parser.parse_args(argv)
    label_map = dict(pair.split("=", 1) for pair in args.labels.split(",") if pair)
    texts, gold = load_set(args.data, args.limit, args.export_dir)
    outcome = evaluate(args.export_dir / args.file, texts, load_rules())
    metrics = {route: metric(args.data, results, gold, label_map) for route, results in
               (("Python LiteRT (keras-attn predict)", outcome["python"]),
                ("page (LiteRT.js)", outcome["page"]))}
    text = report(f"{args.data}, {len(texts):,} texts, `{args.export_dir / args.file}`",
                  outcome, metrics)
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    if args.differences:
        args.differences.write_text("".join(
            json.dumps({"line": i + 1, "text": t, "python": a, "page": b}, ensure_ascii=False)
            + "\n" for i, (t, a, b) in enumerate(zip(texts, outcome["python"], outcome["page"]))
            if not identical(a, b)), encoding="utf-8")
    return 1 if outcome["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
