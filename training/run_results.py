"""Trains the reference runs and writes their table to docs/results.md.

    python training/run_results.py [--only sst2_scratch ...] [--runs-dir runs] [--results PAGE]

Each run is `keras-attn train training/<name>.yaml` (in a subprocess) on `../shared/data`;
a finished run (its metrics.json exists) is not repeated, an interrupted one resumes from
its last checkpoint. A run that fine-tunes a pretraining run (`PRETRAINED_FROM`) gets
`model.checkpoint=<runs dir>/<that run>`, which is trained first. The table lists the dev
and test metrics of the best epoch, the wall time this script measured (of the process that
finished the run, marked "resumed" when it continued from a checkpoint) and the machine.
It replaces only the page's `results:training` section (`keras_attn.page_sections`): the
notes around it are hand-written and stay as they are.
"""

import argparse
import json
import pathlib
import subprocess
import sys
import time

from keras_attn.machine import cpu_model
from keras_attn.page_sections import read_section
from keras_attn.page_sections import replace_section

HERE = pathlib.Path(__file__).resolve().parent
RUNS = {
    "sst2_scratch_mlm": ("SST-2 training text", "dev perplexity",
                         "bert_tiny masked-LM pretraining (labels unused)", None),
    "sst2_scratch": ("SST-2", "dev accuracy",
                     "from scratch: the bert_tiny above (2 layers, hidden 128) fine-tuned", 0.80),
    "conll2003_minilm": ("CoNLL-2003", "test entity F1", "all-MiniLM-L6-v2 fine-tuned", 0.87),
    "sst2_minilm": ("SST-2", "dev accuracy", "all-MiniLM-L6-v2 fine-tuned", 0.89),
}
SECTION = "results:training"

# Runs that fine-tune the encoder of a pretraining run (trained first, in the same runs dir).
PRETRAINED_FROM = {"sst2_scratch": "sst2_scratch_mlm"}


def run(name, runs_dir):
    output_dir = pathlib.Path(runs_dir) / name
    metrics = output_dir / "metrics.json"
    if not metrics.is_file():
        command = [sys.executable, "-m", "keras_attn.cli", "train", str(HERE / f"{name}.yaml"),
                   "--output-dir", str(output_dir)]
        if name in PRETRAINED_FROM:
            run(PRETRAINED_FROM[name], runs_dir)
            pretrained = (pathlib.Path(runs_dir) / PRETRAINED_FROM[name]).resolve()
            command += ["--set", f"model.checkpoint={pretrained}"]
        resumed = any((output_dir / "checkpoints").glob("*"))
        started = time.time()
        print(" ".join(command), flush=True)
        subprocess.run(command, check=True)
        (output_dir / "wall_seconds.txt").write_text(
            f"{time.time() - started:.0f}\n" + ("resumed\n" if resumed else ""))
    return json.loads(metrics.read_text(encoding="utf-8"))


def wall_time(runs_dir, name):
    """`(seconds, resumed)` this script measured for a run, `(None, False)` if it has none."""
    path = pathlib.Path(runs_dir, name, "wall_seconds.txt")
    if not path.is_file():
        return None, False
    lines = path.read_text().split()
    return float(lines[0]), lines[1:] == ["resumed"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="*", choices=sorted(RUNS), default=sorted(RUNS),
                        help="runs to train and measure; the table keeps the other rows")
    parser.add_argument("--runs-dir", default="runs")
    parser.add_argument("--results", default=str(HERE.parent / "docs" / "results.md"))
    args = parser.parse_args(argv)
    rows = [table_row(name, run(name, args.runs_dir), *wall_time(args.runs_dir, name))
            for name in RUNS if name in args.only]
    write_results(rows, pathlib.Path(args.results), cpu_model())


def table_row(name, results, wall, resumed):
    """The table's values for run `name` from its `metrics.json` (`results`)."""
    dataset, metric, model, target = RUNS[name]
    best_dev = results["best_dev"] or {}
    test = results["test"] or {}
    key = results["metric"]
    return {
        "name": name, "dataset": dataset, "model": model, "metric": metric,
        "value": best_dev.get(key) if metric.startswith("dev") else test.get(key),
        "target": target, "dev": best_dev.get(key), "test": test.get(key),
        "best_epoch": results["best_epoch"], "epochs_run": len(results["history"]),
        # Updates actually run (early stopping may end a run before its planned total).
        "updates": results["history"][-1]["updates"],
        "wall": wall, "resumed": resumed,
        "tokens_per_second": results["history"][-1]["tokens_per_second"],
        "config": f"training/{name}.yaml",
    }


def table_line(r):
    target = f"≥ {r['target']:.2f}" if r["target"] is not None else "—"
    wall = f"{r['wall'] / 60:.0f} min" if r["wall"] else "—"
    if r["wall"] and r.get("resumed"):
        wall += " (resumed)"
    return (f"| `{r['config']}` | {r['dataset']} | {r['model']} | {r['metric']} | "
            f"**{r['value']:.4f}** | {target} | {r['dev']:.4f} | "
            f"{'—' if r['test'] is None else format(r['test'], '.4f')} | "
            f"{r['best_epoch']} / {r['epochs_run']} | {r['updates']:,} | {wall} | "
            f"{r['tokens_per_second']:,.0f} |")


def write_results(rows, path, cpu):
    """Replaces the `results:training` section of the page at `path` with the table of
    `rows`, in the order of `RUNS`; a run not measured now keeps its row of the page. The
    rest of the page is left as it is."""
    lines = {f"training/{name}.yaml": None for name in RUNS}
    for line in read_section(path, SECTION).splitlines():
        config = line.split("`")[1] if line.startswith("| `") else None
        if config in lines:
            lines[config] = line
    lines.update({r["config"]: table_line(r) for r in rows})
    text = [
        "Measured with `python training/run_results.py` (each row is "
        "`keras-attn train training/<run>.yaml`) on the shared data beside the checkout "
        "(`../shared/data`).",
        f"Machine: {cpu}, 2 cores, no GPU; TensorFlow/Keras versions in each run's "
        "`metrics.json`. Wall time covers data preparation, training and evaluation, and "
        "any other load the machine had at the time (an upper bound); \"resumed\": the time "
        "of the process that finished a run continued from its checkpoint.",
        "",
        "| run | data | model | metric | value | target | dev | test | best epoch / run | "
        "updates | wall time | train tokens/s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        *(line for line in lines.values() if line is not None),
    ]
    replace_section(path, SECTION, "\n".join(text))
    print(f"wrote the {SECTION} section of {path}")


if __name__ == "__main__":
    main()
