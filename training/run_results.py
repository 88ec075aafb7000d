"""Trains the reference runs and writes their numbers to docs/results.md.

    python training/run_results.py [--only sst2_scratch ...] [--runs-dir runs]

Each run is `keras-attn train training/<name>.yaml` (in a subprocess) on `../shared/data`;
a finished run (its metrics.json exists) is not repeated, an interrupted one resumes from
its last checkpoint. A run that fine-tunes a pretraining run (`PRETRAINED_FROM`) gets
`model.checkpoint=<runs dir>/<that run>`, which is trained first. The table lists the dev
and test metrics of the best epoch, the wall time and the machine.
"""

import argparse
import json
import pathlib
import subprocess
import sys
import time

from keras_attn.machine import cpu_model

HERE = pathlib.Path(__file__).resolve().parent
RUNS = {
    "sst2_scratch_mlm": ("SST-2 training text", "dev perplexity",
                         "bert_tiny masked-LM pretraining (labels unused)", None),
    "sst2_scratch": ("SST-2", "dev accuracy",
                     "from scratch: the bert_tiny above (2 layers, hidden 128) fine-tuned", 0.80),
    "conll2003_minilm": ("CoNLL-2003", "test entity F1", "all-MiniLM-L6-v2 fine-tuned", 0.87),
    "sst2_minilm": ("SST-2", "dev accuracy", "all-MiniLM-L6-v2 fine-tuned", 0.89),
    "conll2003_scratch": ("CoNLL-2003", "test entity F1",
                          "from scratch (bert_mini: 4 layers, hidden 256, CRF)", None),
}

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
        started = time.time()
        print(" ".join(command), flush=True)
        subprocess.run(command, check=True)
        (output_dir / "wall_seconds.txt").write_text(f"{time.time() - started:.0f}\n")
    return json.loads(metrics.read_text(encoding="utf-8"))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="*", choices=sorted(RUNS), default=sorted(RUNS))
    parser.add_argument("--runs-dir", default="runs")
    parser.add_argument("--results", default=str(HERE.parent / "docs" / "results.md"))
    args = parser.parse_args(argv)
    rows = []
    for name in [n for n in RUNS if n in args.only]:
        results = run(name, args.runs_dir)
        dataset, metric, model, target = RUNS[name]
        best_dev = results["best_dev"] or {}
        test = results["test"] or {}
        key = results["metric"]
        value = best_dev.get(key) if metric.startswith("dev") else test.get(key)
        wall = pathlib.Path(args.runs_dir, name, "wall_seconds.txt")
        rows.append({
            "name": name, "dataset": dataset, "model": model, "metric": metric,
            "value": value, "target": target, "dev": best_dev.get(key), "test": test.get(key),
            "best_epoch": results["best_epoch"], "epochs_run": len(results["history"]),
            # Updates actually run (early stopping may end a run before its planned total).
            "updates": results["history"][-1]["updates"],
            "wall": float(wall.read_text()) if wall.is_file() else None,
            "tokens_per_second": results["history"][-1]["tokens_per_second"],
            "config": f"training/{name}.yaml",
        })
    write_results(rows, pathlib.Path(args.results), cpu_model())


def write_results(rows, path, cpu):
    lines = [
        "# Results",
        "",
        "Measured with `python training/run_results.py` (each row is "
        "`keras-attn train training/<run>.yaml`) on the shared data beside the checkout "
        "(`../shared/data`).",
        f"Machine: {cpu}, 2 cores, no GPU; TensorFlow/Keras versions in each run's "
        "`metrics.json`. Wall time covers data preparation, training and evaluation, and "
        "any other load the machine had at the time (an upper bound).",
        "The export stage of the two MiniLM runs (int8 / fp16 / fp32 TFLite, ONNX, "
        "SavedModel: accuracy against the float model, size, latency, the int8 targets) is "
        "measured by `python export/run_export_results.py` in "
        "[export_results.md](export_results.md).",
        "",
        "| run | data | model | metric | value | target | dev | test | best epoch / run | "
        "updates | wall time | train tokens/s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        target = f"≥ {r['target']:.2f}" if r["target"] is not None else "—"
        wall = f"{r['wall'] / 60:.0f} min" if r["wall"] else "—"
        lines.append(
            f"| `{r['config']}` | {r['dataset']} | {r['model']} | {r['metric']} | "
            f"**{r['value']:.4f}** | {target} | {r['dev']:.4f} | "
            f"{'—' if r['test'] is None else format(r['test'], '.4f')} | "
            f"{r['best_epoch']} / {r['epochs_run']} | {r['updates']:,} | {wall} | "
            f"{r['tokens_per_second']:,.0f} |")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
