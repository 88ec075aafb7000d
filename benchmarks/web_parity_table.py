"""docs/web.md's parity table: the page (LiteRT.js in headless Chromium) against Python LiteRT
on the golden texts and the first sentences of SST-2 dev / CoNLL-2003 test, per file.

Usage:
    python benchmarks/web_parity_table.py NAME=ROOT [NAME=ROOT ...] [--limit 300]
        [--files model_int8_buckets.tflite,model_fp32.tflite] [--out FILE.md]

Each ROOT holds `sentiment/export` and `entities/export` (what `make demo` writes in
`runs/demo`, `apps/web_demo/tools/make_test_exports.py` in `runs/web_test`); NAME labels its
rows. Every row is one `benchmarks/web_accuracy.py` evaluation (`evaluate`): the texts, how
many get bit-identical logits, the largest logit move (int8 steps of the output scale for an
int8 file), Python's top-two margin on each row whose answer flipped (in steps), the texts
answered alike, and whether the parity rules hold (`apps/web_demo/e2e/parity_rules.json`).
Prints the table and writes it to `--out`; exits 1 when a row breaks the rules.
"""

import argparse
import importlib.util
import pathlib
import sys

_SPEC = importlib.util.spec_from_file_location(
    "web_accuracy", pathlib.Path(__file__).with_name("web_accuracy.py"))
web_accuracy = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(web_accuracy)

TASKS = (("sentiment", "sst2", "SST-2 dev"), ("entities", "conll2003", "CoNLL-2003 test"))
HEADER = ["| export | file | texts | bit-identical logits | largest move | flipped rows "
          "(Python's margin, steps) | same answer | rules |",
          "| --- | --- | --- | ---: | ---: | --- | ---: | --- |"]


def table_row(name, task, file, texts_name, outcome):
    """One markdown row of `web_accuracy.evaluate`'s outcome."""
    parity, n = outcome["parity"], len(outcome["python"])
    agree = sum(web_accuracy.same(a["result"], b["result"])
                for a, b in zip(outcome["python"], outcome["page"]))
    if parity is None:
        moved = web_accuracy.largest_difference(outcome["python"], outcome["page"])
        cells = ["", f"{moved:.1e}", ""]
    else:
        margins = sorted(m for v in parity["per_text"] for _, m in v["flips"])
        steps = parity["max_steps"]
        cells = [f"{parity['identical']:,}", f"{steps:g} step{'' if steps == 1 else 's'}",
                 ", ".join(f"{m:.1f}" for m in margins) or "none"]
    verdict = "kept" if not outcome["failures"] else f"{len(outcome['failures'])} broken"
    return (f"| {name}, {task} | `{file}` | {n:,} {texts_name} | {cells[0]} | {cells[1]} | "
            f"{cells[2]} | {agree:,} | {verdict} |")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("exports", nargs="+", help="NAME=ROOT pairs")
    parser.add_argument("--limit", type=int, default=300)
    parser.add_argument("--files", default="model_int8_buckets.tflite,model_fp32.tflite")
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args(argv)
    if any("=" not in pair for pair in args.exports):
        parser.error(f"each export is NAME=ROOT. Received: {args.exports}")
    rules, lines, broken = web_accuracy.load_rules(), list(HEADER), False
    for name, root in (pair.split("=", 1) for pair in args.exports):
        for task, data, data_name in TASKS:
            export_dir = pathlib.Path(root) / task / "export"
            for texts_name, texts in (
                    ("golden", web_accuracy.load_set("golden", None, export_dir)[0]),
                    (data_name, web_accuracy.load_set(data, args.limit)[0])):
                for file in args.files.split(","):
                    outcome = web_accuracy.evaluate(export_dir / file, texts, rules)
                    broken |= bool(outcome["failures"])
                    lines.append(table_row(name, task, file, texts_name, outcome))
                    print(lines[-1], flush=True)
    table = "\n".join(lines) + "\n"
    print("\n" + table)
    if args.out:
        args.out.write_text(table, encoding="utf-8")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
