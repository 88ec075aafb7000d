"""`keras-attn export RUN_DIR`: every deployable artifact of a trained classification or NER
run, each checked against the Keras float model, with a report.

The export is a loop over the artifact steps (`keras_attn.export.artifacts.ARTIFACT_STEPS`;
a finished file is reused when the command runs again), around:

1. the source run (`RunDirectory`: `model.keras`, `config.json`, `vocab.txt`, `labels.txt`,
   and the evaluation data its config names);
2. the int8 model: the run's calibrated twin made by the quantize stage in `qat/`
   (`keras_attn.stages.quantize_stage.quantize_run`, the `QuantizationRecipe`), or
   the `--qat-run` given; with an int8 budget, `model_int8.tflite` itself is converted
   first and held to it on XNNPACK (`keras_attn.export.file_budget`: ops move to float
   until the file is within it, the choice written back to that QAT run);
3. the steps: TFLite (fixed length and length-bucketed), ONNX, SavedModel, text-in TFLite;
4. the export directory's side files (`ExportDirectory`: `vocab.txt`, `labels.txt`,
   `model_card.json` with the artifact list, `golden_vectors.jsonl`), the metadata embedded
   in every model file and, for a classifier, the MediaPipe files;
5. `export_report.json` / `export_report.md` (written last): per artifact the task metric,
   agreement with the Keras float model, max |Δlogit|, size, p50/p90 latency, op histograms.
"""

import dataclasses
import os
import pathlib
import time

import keras
import numpy as np
import tensorflow as tf

from keras_attn import atomic_files
from keras_attn.export.artifact_scoring import ArtifactScorer
from keras_attn.export.artifact_scoring import compare
from keras_attn.export.artifact_scoring import interleaved_latency
from keras_attn.export.artifacts import ARTIFACT_STEPS
from keras_attn.export.artifacts import ExportPlan
from keras_attn.export.export_report import report_markdown
from keras_attn.export.golden_vectors import write_golden_vectors
from keras_attn.export.length_buckets import LATENCY_EXAMPLES
from keras_attn.export.length_buckets import bucket_latency
from keras_attn.export.length_buckets import bucketed_file_name
from keras_attn.export.mediapipe_export import self_describing_artifacts
from keras_attn.export.tflite.tflite_export import bucket_lengths
from keras_attn.export.twin_agreement import twin_agreement
from keras_attn.machine import cpu_description
from keras_attn.quantization.quantization_sensitivity import SENSITIVITY_EXAMPLES
from keras_attn.quantization.quantization_sensitivity import quantization_sensitivity
from keras_attn.runs.export_directory import ExportDirectory
from keras_attn.runs.export_directory import ModelCard
from keras_attn.runs.quantization_recipe import QuantizationRecipe
from keras_attn.runs.run_directory import RunDirectory
from keras_attn.runs.run_directory import RunDirectoryError
from keras_attn.runs.run_lock import run_lock
from keras_attn.runs.task_head import max_sequence_length
from keras_attn.runs.task_registry import DEPLOYABLE_TASKS
from keras_attn.runs.task_registry import task_spec
from keras_attn.stages.export_options import ExportError
from keras_attn.stages.export_options import ExportOptions
from keras_attn.stages.int8_file_budget import file_within_budget
from keras_attn.stages.quantize_stage import calibration_batches
from keras_attn.stages.quantize_stage import quantize_run
from keras_attn.stages.quantize_stage import quantized_run_model
from keras_attn.text.hard_cases import HARD_CASES
from keras_attn.text.labelled_examples import CALIBRATION_BATCH
from keras_attn.version import __version__
from keras_attn.visualization import plot_quantization_sensitivity

SENSITIVITY_PICTURE = "quantization_sensitivity.png"


def _directory_size(path):
    path = pathlib.Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


class RunExporter:
    """Exports one `keras-attn train` run; `run()` returns the report dict.

    Args:
        run_dir: the training run directory.
        output_dir: where the artifacts go.
        options: `ExportOptions`.
        log: callable receiving progress lines.
    """

    def __init__(self, run_dir, output_dir, options=None, log=None):
        self.run_dir = pathlib.Path(run_dir)
        self.output_dir = pathlib.Path(output_dir)
        self.export = ExportDirectory(output_dir)
        self.options = options or ExportOptions()
        self.options.check()
        self.log = log or (lambda message: None)
        self.budget = None  # the QAT run's int8 budget search, if it had one
        self.qat_run = None  # the QAT run directory of the int8 model
        # model_int8.tflite's outputs on the evaluation examples, scored by the budget
        # check when its held-out examples are those: {builtin_kernels: outputs}
        self._int8_file_outputs = {}
        self._calibration_batches = None
        self.source = RunDirectory(run_dir)
        try:
            self.source.require("model.keras", "config.json", "vocab.txt", "labels.txt",
                                needed_for="exporting a run")
        except RunDirectoryError as error:
            raise ExportError(str(error)) from None

    # --- the source run -----------------------------------------------------------------

    def _load(self):
        try:
            self._read_source()
        except RunDirectoryError as error:
            raise ExportError(str(error)) from None
        self.log(f"source: {self.run_dir} ({self.task}, {type(self.model).__name__}, "
                 f"{self.model.count_params():,} parameters); evaluation on {self.eval_split} "
                 f"({len(self.examples):,} examples); sequence length {self.length}")

    def _read_source(self):
        if self.source.task not in DEPLOYABLE_TASKS:
            raise ExportError(
                f"{self.run_dir}: task {self.source.task!r} has no export; `keras-attn "
                f"export` takes {' and '.join(DEPLOYABLE_TASKS)} runs")
        self.task, self.labels = self.source.task, self.source.labels()
        self.metric = task_spec(self.task).metric
        self.tagger = task_spec(self.task).token_labels  # logits per word piece
        self.model = self.source.load_model()
        self.use_crf = bool(getattr(self.model, "use_crf", False))
        self.length = self.source.sequence_length(self.options.sequence_length,
                                                  max_sequence_length(self.model))
        trained = self.source.tokenizer_settings().max_length
        if self.length < trained:
            self.log(f"note: sequence_length={self.length} is shorter than the {trained} "
                     "tokens the model was trained with")
        self.eval_split = self._eval_split()
        self.examples = self.source.examples(self.eval_split, self.length, log=self.log)[
            : self.options.max_eval_examples]
        self.scorer = ArtifactScorer(self.examples, self.length, self.model, self.labels,
                                     self.tagger)

    def _eval_split(self):
        split = self.options.eval_split
        if split == "auto":
            order = ("test", "dev") if self.tagger else ("dev", "test")  # CoNLL reports test
            split = next((s for s in order if self.source.data_file(s)), None)
        if not split or not self.source.data_file(split):
            raise ExportError(
                f"{self.run_dir}: the run has no {split or 'dev or test'} data to evaluate "
                "the artifacts on (data.dev / data.test in its config)")
        return split

    def _int8_model(self):
        """The calibrated twin: of `options.qat_run`, or made by the quantize stage in
        `OUTPUT/qat` (a CRF tagger's too: its emissions convert like the float tagger's)."""
        recipe = self.options.quantization
        try:
            if self.options.qat_run is not None:
                qat_run = RunDirectory(self.options.qat_run)
                lineage = qat_run.lineage()
                if lineage.quantization is None:
                    raise ExportError(f"--qat-run {qat_run.path} is not a QAT run (made by "
                                      "`keras-attn quantize RUN`)")
                recipe = QuantizationRecipe.from_dict(lineage.quantization)
            else:
                qat_run = quantize_run(self.run_dir, self.output_dir / "qat", recipe,
                                       self.length, self.log)
        except RunDirectoryError as error:
            raise ExportError(str(error)) from None
        self.recipe, self.qat_run = recipe, qat_run
        self.budget = qat_run.metrics().get("quantization_budget")
        model = quantized_run_model(qat_run, recipe, self._calibration())
        model.freeze_ranges()  # the roundings of the int8 file (biases too)
        return model

    def _calibration(self):
        """The calibration batches of the int8 files (the quantize stage's)."""
        if self._calibration_batches is None:
            self._calibration_batches = calibration_batches(
                self.source, self.options.quantization, self.length)
        return self._calibration_batches

    def _plan(self, int8_model):
        return ExportPlan(
            output_dir=self.output_dir, model=self.model, int8_model=int8_model,
            length=self.length,
            bucket_lengths=tuple(bucket_lengths(self.length, self.options.smallest_bucket)),
            calibration=self._calibration(),
            tokenizer=self.source.tokenizer(self.length), labels=self.labels,
            options=self.options, log=self.log)

    def _sensitivity(self, int8_model, plan):
        """The report's `quantization_sensitivity` rows: the int8 error each group of the
        calibrated twin adds alone, on the first `SENSITIVITY_EXAMPLES` calibration
        examples (`None` without a twin)."""
        if int8_model is None:
            return None
        batches = plan.calibration[:max(1, SENSITIVITY_EXAMPLES // CALIBRATION_BATCH)]
        self.log(f"quantization sensitivity of {len(int8_model.quantization_ops())} ops "
                 f"on {sum(len(b['token_ids']) for b in batches)} calibration examples")
        rows = quantization_sensitivity(int8_model, batches)
        try:  # the picture needs matplotlib, an optional extra: without it, the table only
            plot_quantization_sensitivity(self.output_dir / SENSITIVITY_PICTURE, rows,
                                          int8_model.float_ops)
        except ImportError as error:
            self.log(f"{SENSITIVITY_PICTURE} skipped: {error}")
        return rows

    # --- the steps ----------------------------------------------------------------------

    def _write_artifacts(self, plan):
        """Each step's files that are not written yet; returns `[(step, files)]` and
        `{step name: why an optional step wrote nothing}`."""
        steps, errors = [(step, step.files(plan)) for step in ARTIFACT_STEPS], {}
        for step, files in steps:
            missing = [f for f in files if not step.is_written(self.output_dir / f.file)]
            if not missing:
                continue
            try:
                step.write(plan, missing)
            except (ValueError, RuntimeError) as error:
                if not step.optional:
                    raise
                errors[step.name] = str(error).splitlines()[0]
                self.log(f"{', '.join(f.file for f in missing)} not written: "
                         f"{errors[step.name]}")
        return steps, errors

    def _evaluate(self, steps, int8_model):
        """The report's rows (the Keras float model first) with their latencies, and the
        `twin_agreement` section (`None` without a calibrated twin)."""
        reference = self.scorer.collect(self.scorer.keras_predict(self.model))
        rows = [self._row("model.keras (float, Keras)", self.run_dir / "model.keras",
                          reference, reference)]
        twin = None
        if int8_model is not None:
            twin = self.scorer.collect(self.scorer.keras_predict(int8_model.model))
            rows.append(self._row("QAT model (Keras, fake int8)",
                                  self.output_dir / "qat" / "model.keras", reference, twin))
        calls, timed_input, agreement = {}, self.scorer.latency_input(), None
        for step, files in steps:
            for f in files:
                path = self.output_dir / f.file
                if not f.scored or not step.is_written(path):
                    continue
                self.log(f"  {f.report_name}")
                outputs = self._int8_file_outputs.get(False) if f.file == "model_int8.tflite" \
                    else None
                if outputs is None:
                    outputs = self.scorer.collect(step.run_logits(path))
                row = self._row(f.report_name, path, reference, outputs, step.details(path))
                rows.append(row)
                if twin is not None and f.file == "model_int8.tflite":
                    agreement = self._twin_agreement(int8_model, twin, outputs, step, path)
                if f.timed:
                    calls[row["artifact"]] = \
                        lambda t, s=step, p=path: s.timed_call(p, t, timed_input)
        self.log(f"latency of {len(calls)} artifacts, interleaved, "
                 f"{self.options.latency_runs} runs each per thread count")
        latency = interleaved_latency(calls, self.options.latency_threads,
                                      self.options.latency_runs)
        for row in rows:
            if row["artifact"] in latency:
                row["latency"] = latency[row["artifact"]]
        return rows, agreement

    def _twin_agreement(self, int8_model, twin, xnnpack, step, path):
        """`twin_agreement`: the calibrated model against its file, and the file on LiteRT's
        builtin kernels against XNNPACK (the runtime's own floor)."""
        self.log(f"  {path.name} on LiteRT's builtin kernels (no XNNPACK), against the "
                 "calibrated model")
        builtin = self._int8_file_outputs.get(True)  # scored by the budget check
        if builtin is None:
            builtin = self.scorer.collect(step.run_logits(path, builtin_kernels=True))
        logit_step = float(int8_model.model.get_layer("logits").output_quantizer.step())
        return twin_agreement(twin, xnnpack, builtin, logit_step)

    def _row(self, name, path, reference, outputs, details=None):
        return {"artifact": name, "path": str(path),
                "metric": self.scorer.score(outputs)[self.metric],
                **compare(outputs, reference), **(details or {})}

    # --- side files ---------------------------------------------------------------------

    def _model_card(self, rows, steps, int8_model):
        quantization = int8_model is not None and {"recipe": self.recipe.to_dict(),
                                                   "description": self.recipe.describe()}
        card = ModelCard.card_dict(
            self.task, list(self.labels.labels), self.length, self.source.tokenizer(self.length),
            lowercase=self.source.tokenizer_settings().lowercase, metric=self.metric,
            crf=self._crf_section(), metrics={r["artifact"]: r.get("metric") for r in rows},
            source_run=str(self.run_dir.resolve()), version=__version__,
            quantization=quantization or None)
        card["artifacts"] = [f.card_entry() for step, files in steps for f in files
                             if step.is_written(self.output_dir / f.file)]
        self.export.write_card(card)

    def _crf_section(self):
        """The card's CRF transitions (rounded), or `None` without a CRF."""
        if not self.use_crf:
            return None
        crf = self.model.get_layer("crf")
        return ModelCard.crf_section(*(keras.ops.convert_to_numpy(getattr(crf, name))
                                  for name in ("transitions", "start_transitions",
                                               "end_transitions")))

    def _golden_vectors(self):
        """`golden_vectors.jsonl` (`keras_attn.export.golden_vectors`): texts -> ids,
        offsets, (words), Keras float logits and the labels or entity spans decoded from
        those logits, for the app's parity tests."""
        texts = list(HARD_CASES) + self.source.texts(self.eval_split,
                                                     self.options.golden_examples)
        return write_golden_vectors(
            self.output_dir / "golden_vectors.jsonl", texts, self.task,
            self.source.tokenizer(self.length), self.scorer.keras_predict(self.model),
            list(self.labels.labels), crf=self._crf_section())

    def _length_buckets(self, plan, steps):
        """The report's `length_buckets` section: fixed vs bucketed latency, interleaved,
        1 thread, over up to `LATENCY_EXAMPLES` evaluation examples sampled at random."""
        written = [f.precision for step, files in steps if step.name == "tflite_buckets"
                   for f in files]
        if not written:
            return None
        rng = np.random.default_rng(0)
        count = min(LATENCY_EXAMPLES, len(self.examples))
        sample = sorted(rng.choice(len(self.examples), count, replace=False))
        inputs = [self.scorer.inputs(self.examples[i]) for i in sample]
        tokens = [int(x["padding_mask"].sum()) for x in inputs]
        self.log(f"length buckets: latency over {count} evaluation examples, fixed vs "
                 "bucketed, interleaved")
        latency = {v: bucket_latency(self.output_dir / f"model_{v}.tflite",
                                     self.output_dir / bucketed_file_name(v), inputs)
                   for v in written}
        first = next(iter(latency.values()))
        return {"lengths": list(plan.bucket_lengths), "examples": count,
                "tokens_p50": float(np.median(tokens)), "tokens_mean": float(np.mean(tokens)),
                "bucket_counts": first["bucket_counts"], "num_threads": first["num_threads"],
                "cpu": cpu_description(), "latency": latency}

    # --- the run ------------------------------------------------------------------------

    def run(self):
        started = time.perf_counter()
        self.output_dir.mkdir(parents=True, exist_ok=True)
        atomic_files.remove_stale_temporaries(self.output_dir)  # of a killed export
        self._load()
        for name in ("vocab.txt", "labels.txt"):
            atomic_files.copy_file(self.run_dir / name, self.output_dir / name)
        int8_model = self._int8_model()
        plan = self._plan(int8_model)
        sensitivity = self._sensitivity(int8_model, plan)
        if int8_model is not None and self.budget:
            int8_model, self.budget, outputs = file_within_budget(
                self, plan, lambda: [r["op"] for r in sensitivity])
            self._int8_file_outputs = outputs or {}
        steps, errors = self._write_artifacts(plan)
        self.log(f"evaluating every artifact on {len(self.examples):,} {self.eval_split} "
                 "examples")
        rows, agreement = self._evaluate(steps, int8_model)
        self._model_card(rows, steps, int8_model)
        golden = self._golden_vectors()
        length_buckets = self._length_buckets(plan, steps)
        self_describing = self_describing_artifacts(
            self.output_dir, self.model, plan.tokenizer,
            list(HARD_CASES) + self.source.texts(self.eval_split, len(self.examples)), self.log)
        for row in rows:  # the shipped size: with the metadata embedded (a re-run reuses it)
            row["size_bytes"] = _directory_size(row["path"])
        report = {
            "source_run": str(self.run_dir.resolve()), "task": self.task,
            "metric": self.metric, "eval_split": self.eval_split,
            "eval_examples": len(self.examples), "sequence_length": self.length,
            "artifacts": rows, "golden_vectors": golden,
            "model_text_tflite_error": errors.get("text_tflite"),
            "self_describing_tflite": self_describing, "length_buckets": length_buckets,
            "machine": _machine(), "seconds": round(time.perf_counter() - started, 1),
            "quantization": self.recipe.to_dict() if int8_model is not None else None,
            "quantization_sensitivity": sensitivity, "twin_agreement": agreement,
            "quantization_budget": self.budget if int8_model is not None else None,
            "options": {name: list(value) if isinstance(value, tuple) else value  # as JSON
                        for name, value in dataclasses.asdict(self.options).items()},
        }
        self.export.write_report(report, report_markdown(report))
        self.log(f"wrote {self.output_dir / 'export_report.md'}")
        return report


def _machine():
    return {"cpu": cpu_description(), "cpu_count": os.cpu_count(), "tensorflow": tf.__version__,
            "keras": keras.__version__}


def export_run(run_dir, output_dir, options=None, log=None):
    """Exports a trained run; see `RunExporter`. Returns the report dict. The export
    directory is held for writing, the run (and a `--qat-run`) for reading (`run_lock`)."""
    qat_run = options.qat_run if options is not None else None
    with run_lock(writes=[output_dir], reads=[run_dir] + ([qat_run] if qat_run else [])):
        return RunExporter(run_dir, output_dir, options, log).run()
