"""`keras-attn export RUN_DIR`: every deployable artifact of a trained classification or NER
run, each checked against the Keras float model, with a report.

The export is a loop over the artifact steps (`keras_attn.export.artifacts.ARTIFACT_STEPS`;
a finished file is reused when the command runs again), around:

1. the source run (`RunDirectory`: `model.keras`, `config.json`, `vocab.txt`, `labels.txt`,
   and the evaluation data its config names);
2. the int8 model: the run's calibrated twin made by the quantize stage in `qat/`
   (`keras_attn.quantization.quantize_stage.quantize_run`, the `QuantizationRecipe`), or
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
import shutil
import time

import keras
import numpy as np
import tensorflow as tf

from keras_attn import atomic_files
from keras_attn.errors import KerasAttnError
from keras_attn.export.artifact_scoring import ArtifactScorer
from keras_attn.export.artifact_scoring import compare
from keras_attn.export.artifact_scoring import interleaved_latency
from keras_attn.export.artifacts import ARTIFACT_STEPS
from keras_attn.export.artifacts import ExportPlan
from keras_attn.export.artifacts import TFLiteStep
from keras_attn.export.export_report import report_markdown
from keras_attn.export.file_budget import file_budget
from keras_attn.export.file_budget import file_measures
from keras_attn.export.golden_vectors import crf_card_section
from keras_attn.export.golden_vectors import model_card
from keras_attn.export.golden_vectors import write_golden_vectors
from keras_attn.export.length_buckets import LATENCY_EXAMPLES
from keras_attn.export.length_buckets import bucket_latency
from keras_attn.export.length_buckets import bucketed_file_name
from keras_attn.export.mediapipe_export import self_describing_artifacts
from keras_attn.export.tflite_export import SMALLEST_BUCKET
from keras_attn.export.tflite_export import bucket_lengths
from keras_attn.export.twin_agreement import twin_agreement
from keras_attn.layers.validation import check_int
from keras_attn.layers.validation import check_positive_int
from keras_attn.machine import cpu_description
from keras_attn.quantization.model_queries import max_sequence_length
from keras_attn.quantization.quantization_budget import held_out_examples
from keras_attn.quantization.quantization_budget import held_out_score
from keras_attn.quantization.quantization_recipe import QuantizationRecipe
from keras_attn.quantization.quantization_sensitivity import SENSITIVITY_EXAMPLES
from keras_attn.quantization.quantization_sensitivity import quantization_sensitivity
from keras_attn.quantization.quantize_stage import calibration_batches
from keras_attn.quantization.quantize_stage import quantize_run
from keras_attn.quantization.quantize_stage import quantized_run_model
from keras_attn.runs.export_directory import ExportDirectory
from keras_attn.runs.run_directory import RunDirectory
from keras_attn.runs.run_directory import RunDirectoryError
from keras_attn.runs.run_lock import run_lock
from keras_attn.text.hard_cases import HARD_CASES
from keras_attn.text.labelled_examples import CALIBRATION_BATCH
from keras_attn.training.task_registry import DEPLOYABLE_TASKS
from keras_attn.training.task_registry import task_spec
from keras_attn.version import __version__
from keras_attn.visualization import plot_quantization_sensitivity

GOLDEN_DATA_EXAMPLES = 1000
SENSITIVITY_PICTURE = "quantization_sensitivity.png"
EVAL_SPLITS = ("auto", "dev", "test")  # auto: test for a tagger, dev for a classifier


@dataclasses.dataclass
class ExportOptions:
    """What `export_run` produces and how it measures it.

    Attributes:
        sequence_length: fixed input length of the mobile artifacts; defaults to the run's
            `data.max_length`.
        quantization: the `QuantizationRecipe` of `model_int8.tflite` (default: the measured
            best); the export calls the quantize stage with it unless `qat_run` is given.
        qat_run: a QAT run directory made by `keras-attn quantize` to convert instead.
        eval_split: `"dev"`, `"test"` or `"auto"` (test for NER, dev for classification,
            whichever exists).
        max_eval_examples: evaluate on the first N examples only.
        latency_threads: thread counts of the latency measurements.
        latency_runs: timed runs per artifact and thread count (after 5 warm-up runs),
            taken in turns with the other artifacts.
        text_tflite: also write `model_text.tflite` (raw strings in, tf-text custom ops).
        golden_examples: data sentences in the golden vectors (plus the hard cases).
        length_buckets: also write `model_<variant>_buckets.tflite` (one signature per
            length: `bucket_lengths(sequence_length, smallest_bucket)`) and time
            them against the fixed files on real evaluation inputs.
        smallest_bucket: the shortest bucket.
    """

    sequence_length: int = None
    quantization: QuantizationRecipe = dataclasses.field(default_factory=QuantizationRecipe)
    qat_run: str = None
    eval_split: str = "auto"
    max_eval_examples: int = None
    latency_threads: tuple = (1, 2)
    latency_runs: int = 50
    text_tflite: bool = True
    golden_examples: int = GOLDEN_DATA_EXAMPLES
    length_buckets: bool = True
    smallest_bucket: int = SMALLEST_BUCKET

    def check(self):
        for name in ("sequence_length", "max_eval_examples"):
            if getattr(self, name) is not None:
                check_positive_int(name, getattr(self, name))
        check_positive_int("latency_runs", self.latency_runs)
        check_positive_int("smallest_bucket", self.smallest_bucket)
        check_int("golden_examples", self.golden_examples, low=0)
        if not isinstance(self.quantization, QuantizationRecipe):
            raise ValueError("`quantization` must be a QuantizationRecipe. "
                             f"Received: quantization={self.quantization!r}")
        if self.eval_split not in EVAL_SPLITS:
            raise ValueError("`eval_split` must be 'auto', 'dev' or 'test'. "
                             f"Received: eval_split={self.eval_split!r}")
        if not self.latency_threads:
            raise ValueError("`latency_threads` must name at least one thread count. "
                             f"Received: latency_threads={self.latency_threads!r}")
        for threads in self.latency_threads:
            check_positive_int("latency_threads", threads)


class ExportError(KerasAttnError, ValueError):
    """The run cannot be exported (missing files, unsupported task, bad options)."""


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

    # --- the int8 budget on the file that ships -----------------------------------------

    def _file_within_budget(self, plan, order):
        """`model_int8.tflite` itself held to the int8 budget (`file_budget`): converted
        (or the one an earlier export wrote) and scored on LiteRT with XNNPACK on the
        budget's held-out examples; while it misses, the next op of `order` (a callable
        returning op names, most sensitive first) moves to float and a file is converted
        again. The last file is also scored on the builtin kernels. Sets
        `plan.int8_model` and `self.budget["file"]`, writes a choice beyond the twin's back
        to the export's own QAT run (`qat/`; a `--qat-run` is only scored), and returns the
        chosen model."""
        start = plan.int8_model
        if start is None or not self.budget:
            return start
        split, examples = held_out_examples(self.source, self.recipe, self.length)
        same = split == self.eval_split and self.options.max_eval_examples is None
        scorer = self.scorer if same else self.scorer.on(examples)
        self.log(f"int8 budget on model_int8.tflite (LiteRT, XNNPACK): {len(examples):,} "
                 f"{split} examples")
        step, path = TFLiteStep(), self.output_dir / "model_int8.tflite"
        (int8_file,) = [f for f in step.files(plan) if f.file == path.name]
        trials = atomic_files.temporary_path(self.output_dir / "file_budget")
        outputs = {}

        def file_of(model):
            return path if model is start else trials / path.name

        def measure_file(model):  # the file `score_file` just scored
            predict, x = step.run_logits(file_of(model), num_threads=1), scorer.latency_input()
            return file_measures(file_of(model), lambda: predict(x))

        def score_file(model, builtin_kernels=False):
            file = file_of(model)
            if not file.is_file():  # the start's file, or a moved model's, in `trials`
                _remove(trials)
                step.write(dataclasses.replace(plan, int8_model=model,
                                               output_dir=file.parent), [int8_file])
            outputs[builtin_kernels] = scorer.collect(
                step.run_logits(file, builtin_kernels=builtin_kernels))
            return scorer.score(outputs[builtin_kernels])[self.metric]

        crf = self.model.get_layer("crf") if self.use_crf else None
        # A --qat-run is read, not written: its file is scored, never moved.
        moves = {} if self.options.qat_run is None else {"max_moves": 0}
        chosen, record = file_budget(
            start, self.budget, score_file,
            held_out_score(examples, self.length, self.labels, self.tagger, crf),
            order, log=lambda line: self.log("  " + line), measure_file=measure_file, **moves)
        if not record["within_budget"] and moves:
            self.log(f"  model_int8.tflite misses the budget; --qat-run {self.qat_run.path} "
                     "is not changed: export without --qat-run to move ops for the file")
        builtin = 100 * score_file(chosen, builtin_kernels=True)
        record.update(split=split, examples=len(examples), builtin_kernels_metric=round(
            builtin, 4), builtin_kernels_drop=round(record["float_metric"] - builtin, 4))
        self.budget = {**self.budget, "file": record}
        if chosen is not start:
            self._keep_file_choice(plan, chosen, trials / path.name, path)
        if same:  # the evaluation reuses these scores of the file that stays
            self._int8_file_outputs = outputs
        chosen.freeze_ranges()  # the roundings of its file, as `_int8_model` does
        plan.int8_model = chosen
        return chosen

    def _keep_file_choice(self, plan, chosen, trial, path):
        """The moved model replaces the twin: the files converted from the old one go, the
        QAT run gets the model (so a re-run converts what ships), then the trial file
        becomes `model_int8.tflite`."""
        for step in ARTIFACT_STEPS:
            for f in step.files(plan):
                if f.source == "int8":
                    _remove(self.output_dir / f.file)
        with run_lock(writes=[self.qat_run.path]):  # the quantize stage's lock, again
            self.qat_run.write_finish(chosen.model, {
                **self.qat_run.metrics(), "quantization_budget": self.budget,
                "float_ops": list(chosen.float_ops)})
        self.log(f"  {self.qat_run.path / 'model.keras'}: float ops {list(chosen.float_ops)}")
        os.replace(trial, path)
        _remove(trial.parent)

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
        card = model_card(
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
        return crf_card_section(*(keras.ops.convert_to_numpy(getattr(crf, name))
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
        int8_model = self._file_within_budget(plan, lambda: [r["op"] for r in sensitivity])
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


def _remove(path):
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


def _machine():
    return {"cpu": cpu_description(), "cpu_count": os.cpu_count(), "tensorflow": tf.__version__,
            "keras": keras.__version__}


def export_run(run_dir, output_dir, options=None, log=None):
    """Exports a trained run; see `RunExporter`. Returns the report dict. The export
    directory is held for writing, the run (and a `--qat-run`) for reading (`run_lock`)."""
    qat_run = options.qat_run if options is not None else None
    with run_lock(writes=[output_dir], reads=[run_dir] + ([qat_run] if qat_run else [])):
        return RunExporter(run_dir, output_dir, options, log).run()
