"""A whole evaluation set through the web page and through `keras-attn predict`, on one file.

Usage:
    python benchmarks/web_accuracy.py EXPORT_DIR --data sst2|conll2003
        [--file model_int8_buckets.tflite] [--labels 0=negative,1=positive] [--limit N]
        [--out FILE.md] [--differences FILE.jsonl] [--max-different F]

Writes the set's texts (SST-2 dev sentences, or CoNLL-2003 test sentences as their tokens
joined by spaces) to a file, runs `keras-attn predict FILE --file TEXTS --json` and
`apps/web_demo/tools/page_predict.mjs FILE TEXTS` (the built library on LiteRT.js in headless
Chromium), and reports for both the accuracy (classification, gold labels mapped with
`--labels` where the model's names differ from the data's) or the strict entity F1 (each
CoNLL token tagged with the tag of the word that starts where it starts, `entity_scores`), how
many texts get the same answer (label, or entities and word tags) and the largest probability
difference (an int8 file's logits can move by one int8 step between the browser's and the
native kernels: docs/web.md; `--differences` writes the texts answered otherwise, with both
answers). Exits 1 when more than the fraction `--max-different` (default 0) of the answers
differ. Data is read in place
from `../shared/data` (`KERAS_ATTN_SHARED_DATA`).
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

from keras_attn.text.classification_reader import ClassificationReader
from keras_attn.text.conll_reader import ConllReader
from keras_attn.text.ner import entity_scores

REPO = pathlib.Path(__file__).resolve().parents[1]
WEB = REPO / "apps" / "web_demo"


def shared_data():
    root = os.environ.get("KERAS_ATTN_SHARED_DATA")
    return pathlib.Path(root) if root else REPO.parent / "shared" / "data"


def load_set(name, limit=None):
    """`(texts, gold)`: labels (SST-2 dev) or `(tokens, tags)` pairs (CoNLL-2003 test)."""
    if name == "sst2":
        reader = ClassificationReader(shared_data() / "sst2" / "dev.tsv",
                                      text_column="sentence", label_column="label")
        examples = list(reader)[:limit]
        return [e.text for e in examples], [str(e.label) for e in examples]
    sentences = list(ConllReader(shared_data() / "conll2003" / "test.txt"))[:limit]
    return [" ".join(s.tokens) for s in sentences], [(s.tokens, s.tags) for s in sentences]


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


def probability_difference(a, b):
    """The largest |p_a - p_b| over the labels (0 for a tagger's result)."""
    if "label" not in a:
        return 0.0
    return max(abs(a["probabilities"][k] - b["probabilities"][k]) for k in a["probabilities"])


def run(command, cwd=None):
    """`command`'s standard output; its error output in the message when it fails."""
    done = subprocess.run(command, capture_output=True, text=True, cwd=cwd)
    if done.returncode != 0:
        raise SystemExit(f"error: {' '.join(command[:3])} ... exited {done.returncode}:\n"
                         f"{done.stderr[-2000:]}")
    return done.stdout


def run_routes(model, texts_path):
    """`{route: [result per text]}` for `keras-attn predict` and the page."""
    model, texts_path = pathlib.Path(model).resolve(), pathlib.Path(texts_path).resolve()
    outputs = {
        "keras-attn predict": run([sys.executable, "-m", "keras_attn.cli", "predict", str(model),
                                   "--file", str(texts_path), "--json", "--threads", "1"]),
        "page (LiteRT.js)": run(["node", str(WEB / "tools" / "page_predict.mjs"), str(model),
                                 str(texts_path)], cwd=WEB),
    }
    return {route: [json.loads(line) for line in out.splitlines() if line.strip()]
            for route, out in outputs.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("export_dir", type=pathlib.Path)
    parser.add_argument("--data", choices=("sst2", "conll2003"), required=True)
    parser.add_argument("--file", default="model_int8_buckets.tflite")
    parser.add_argument("--labels", default="", help="gold=model label pairs, comma separated")
    parser.add_argument("--limit", type=int)
    parser.add_argument("--out", type=pathlib.Path)
    parser.add_argument("--differences", type=pathlib.Path)
    parser.add_argument("--max-different", type=float, default=0.0,
                        help="the fraction of texts that may get another answer")
    args = parser.parse_args(argv)
    label_map = dict(pair.split("=", 1) for pair in args.labels.split(",") if pair)
    texts, gold = load_set(args.data, args.limit)
    with tempfile.TemporaryDirectory() as tmp:
        texts_path = pathlib.Path(tmp) / "texts.txt"
        texts_path.write_text("\n".join(texts) + "\n", encoding="utf-8")
        results = run_routes(args.export_dir / args.file, texts_path)
    python, page = results.values()
    if len(python) != len(texts) or len(page) != len(texts):
        raise SystemExit(f"error: {len(texts)} texts, python gave {len(python)}, the page "
                         f"{len(page)} results")
    agree = sum(same(a, b) for a, b in zip(python, page))
    if args.differences:
        args.differences.write_text("".join(
            json.dumps({"line": i + 1, "text": t, "python": a, "page": b}, ensure_ascii=False)
            + "\n" for i, (t, a, b) in enumerate(zip(texts, python, page)) if not same(a, b)),
            encoding="utf-8")
    moved = max(probability_difference(a, b) for a, b in zip(python, page))
    lines = [f"{args.data}, {len(texts):,} texts, `{args.export_dir / args.file}`", "",
             "| route | metric | same answer as keras-attn predict | max \\|Δp\\| |",
             "| --- | ---: | ---: | ---: |"]
    for route, outputs in results.items():
        metric = score(args.data, outputs, gold, label_map)
        name, value = next(iter(metric.items()))
        page_route = route.startswith("page")
        lines.append(f"| {route} | {name} {value:.4f} | "
                     f"{agree if page_route else len(texts):,} / {len(texts):,} | "
                     f"{f'{moved:.1e}' if page_route else ''} |")
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        args.out.write_text(report, encoding="utf-8")
    return 0 if len(texts) - agree <= args.max_different * len(texts) else 1


if __name__ == "__main__":
    sys.exit(main())
