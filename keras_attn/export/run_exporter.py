"""`keras-attn export RUN_DIR`: every deployable artifact of a trained classification or NER
run, each checked against the Keras float model, with a report.

Steps (a finished step is reused when the command runs again):

1. the run's float model, tokenizer, labels and evaluation data (`RUN_DIR` is a
   `keras-attn train` output directory: `model.keras`, `config.json`, `vocab.txt`,
   `labels.txt`);
2. quantization-aware fine-tuning (`qat/`, through `keras-attn train` with
   `model.checkpoint=RUN_DIR`, `model.quantization_aware=true`);
3. TFLite: `model_fp32`, `model_fp16`, `model_dynamic_int8` and `model_int8_ptq` from the
   float model, `model_int8` from the QAT model, all batch 1 with a fixed sequence length,
   builtin ops only; `model_{fp32,dynamic_int8,int8}_buckets.tflite` with one signature per
   length bucket (`keras_attn.export.length_buckets`);
4. `model.onnx` and `model_dynamic_int8.onnx`; `saved_model/` (text in, labels or entity
   spans out); optionally `model_text.tflite`;
5. side files `vocab.txt`, `labels.txt`, `model_card.json`, `golden_vectors.jsonl`;
6. `export_report.json` / `export_report.md`: per artifact the task metric, agreement with
   the Keras float model, max |Δlogit|, size, p50/p90 latency, and the op histograms.
"""

import dataclasses
import json
import os
import pathlib
import shutil
import time

import keras
import numpy as np
import tensorflow as tf
from ai_edge_litert.interpreter import Interpreter

from keras_attn.export.golden_vectors import crf_card_section
from keras_attn.export.golden_vectors import model_card
from keras_attn.export.golden_vectors import write_golden_vectors
from keras_attn.export.golden_vectors import write_model_card
from keras_attn.export.length_buckets import BUCKET_VARIANTS
from keras_attn.export.length_buckets import LATENCY_EXAMPLES
from keras_attn.export.length_buckets import bucket_latency
from keras_attn.export.length_buckets import bucketed_file_name
from keras_attn.export.length_buckets import buckets_markdown
from keras_attn.export.mediapipe_export import self_describing_artifacts
from keras_attn.export.mediapipe_export import self_describing_markdown
from keras_attn.export.onnx_export import OnnxRunner
from keras_attn.export.onnx_export import export_onnx
from keras_attn.export.onnx_export import quantize_onnx_dynamic
from keras_attn.export.serving_module import export_saved_model
from keras_attn.export.serving_module import load_saved_model
from keras_attn.export.text_tflite import export_text_tflite
from keras_attn.export.tflite_export import BucketedTFLite
from keras_attn.export.tflite_export import bucket_lengths
from keras_attn.export.tflite_export import export_tflite
from keras_attn.export.tflite_export import tflite_op_report
from keras_attn.layers.crf import viterbi_decode
from keras_attn.layers.validation import check_int
from keras_attn.layers.validation import check_positive_int
from keras_attn.machine import cpu_description
from keras_attn.text.batching import model_inputs_at_length
from keras_attn.text.classification_reader import ClassificationReader
from keras_attn.text.conll_reader import ConllReader
from keras_attn.text.hard_cases import HARD_CASES
from keras_attn.text.ner import first_piece_mask
from keras_attn.quantization.quantization_recipe import QuantizationRecipe
from keras_attn.quantization.quantize_stage import quantize_run
from keras_attn.runs.run_directory import RunDirectory
from keras_attn.runs.run_directory import RunDirectoryError
from keras_attn.training.task_registry import DEPLOYABLE_TASKS
from keras_attn.training.task_registry import task_spec
from keras_attn.training.tasks import make_task
from keras_attn.version import __version__

TFLITE_FLOAT_VARIANTS = ("fp32", "fp16", "dynamic_int8", "int8_ptq")
LATENCY_ROUNDS = 5  # turns the artifacts take at each latency thread count
GOLDEN_DATA_EXAMPLES = 1000


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
    smallest_bucket: int = 16

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
        if self.eval_split not in ("auto", "dev", "test"):
            raise ValueError("`eval_split` must be 'auto', 'dev' or 'test'. "
                             f"Received: eval_split={self.eval_split!r}")
        if not self.latency_threads:
            raise ValueError("`latency_threads` must name at least one thread count. "
                             f"Received: latency_threads={self.latency_threads!r}")
        for threads in self.latency_threads:
            check_positive_int("latency_threads", threads)


class ExportError(ValueError):
    """The run cannot be exported (missing files, unsupported task, bad options)."""


def _directory_size(path):
    path = pathlib.Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _percentiles(times_ms):
    return {"p50_ms": round(float(np.percentile(times_ms, 50)), 3),
            "p90_ms": round(float(np.percentile(times_ms, 90)), 3), "runs": len(times_ms)}


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
        self.options = options or ExportOptions()
        self.options.check()
        self.log = log or (lambda message: None)
        self._predictors = {}  # id(model) -> (model, its traced predict)
        self.source = RunDirectory(run_dir)
        try:
            self.source.require("model.keras", "config.json", "vocab.txt", "labels.txt",
                             needed_for="exporting a run")
        except RunDirectoryError as error:
            raise ExportError(str(error)) from None

    # --- the source run -----------------------------------------------------------------

    def _load(self):
        if self.source.task not in DEPLOYABLE_TASKS:
            raise ExportError(
                f"{self.run_dir}: task {self.source.task!r} has no export; `keras-attn "
                f"export` takes {' and '.join(DEPLOYABLE_TASKS)} runs")
        self.config = self.source.config()
        self.tokenizer_settings = self.source.tokenizer_settings()
        self.task = make_task(self.config, self.run_dir, self.log, write_files=False)
        self.tagger = task_spec(self.task.name).token_labels  # logits per word piece
        self.task.prepare()
        self.model = self.source.load_model()
        self.use_crf = bool(getattr(self.model, "use_crf", False))
        limit = self.model.backbone.max_sequence_length
        self.length = self.options.sequence_length or self.config.data.max_length
        if self.length > limit:
            raise ExportError(
                f"sequence_length={self.length} exceeds the model's max_sequence_length="
                f"{limit}: use --sequence-length {limit} or less")
        if self.length < self.config.data.max_length:
            self.log(f"note: sequence_length={self.length} is shorter than the "
                     f"{self.config.data.max_length} tokens the model was trained with")
        split = self.options.eval_split
        if split == "auto":
            order = ("test", "dev") if self.tagger else ("dev", "test")  # CoNLL reports test
            split = next((s for s in order if getattr(self.task, f"{s}_examples")), None)
        examples = getattr(self.task, f"{split}_examples", None) if split else None
        if not examples:
            raise ExportError(
                f"{self.run_dir}: the run has no {split or 'dev or test'} data to evaluate "
                "the artifacts on (data.dev / data.test in its config)")
        self.eval_split = split
        self.eval_file = getattr(self.config.data, split)
        self.examples = examples[: self.options.max_eval_examples]
        self.log(f"source: {self.run_dir} ({self.task.name}, {type(self.model).__name__}, "
                 f"{self.model.count_params():,} parameters); evaluation on {split} "
                 f"({len(self.examples):,} examples); sequence length {self.length}")

    # --- evaluation ---------------------------------------------------------------------

    def _collect(self, predict_fixed, batch_size=32):
        """Per-example raw outputs of `predict_fixed(x)` (fixed-length batches): `(C,)`
        logits, or `(n, C)` token logits over the example's `n` real tokens."""
        outputs = [None] * len(self.examples)
        for indices, x in self.task.eval_batches(self.examples, batch_size):
            logits = np.asarray(predict_fixed(model_inputs_at_length(x, self.length)),
                                "float32")
            for row, index in enumerate(indices):
                if self.tagger:
                    n = len(self.examples[index]["token_ids"])
                    outputs[index] = logits[row, :n]
                else:
                    outputs[index] = logits[row]
        return outputs

    def _score(self, outputs):
        if self.use_crf:  # the CRF transitions decode emissions outside the network
            outputs = [{"tags": self._crf_tags(emissions[None], example["word_ids"][None])[0]}
                       for example, emissions in zip(self.examples, outputs)]
        return self.task.score(self.examples, outputs)

    def _compare(self, outputs, reference):
        """Top-1 (classification) or token (NER) agreement and max |Δlogit|."""
        agree, total, delta = 0, 0, 0.0
        for a, b in zip(outputs, reference):
            agree += int(np.sum(np.argmax(a, -1) == np.argmax(b, -1)))
            total += int(np.size(np.argmax(a, -1)))
            delta = max(delta, float(np.max(np.abs(a - b))))
        return {"agreement": agree / total, "max_abs_logit_diff": delta}

    def _keras_predict(self, model):
        """`x -> numpy logits` of `model`, made once per model and kept: a new `tf.function`
        per use (whose Python function may reuse a collected one's address) made
        TensorFlow's retracing detector count traces of different functions as retraces.
        A CRF tagger gives its emissions (`logits`; the tags are decoded outside the
        network), and its `label_mask` input, which only the tags read, is filled with the
        padding mask."""
        key = id(model)
        if key not in self._predictors:
            self._predictors[key] = (model, self._traced_predict(model))
        return self._predictors[key][1]

    def _traced_predict(self, model):
        crf = isinstance(model.output, dict)
        # One trace for every batch and length (shape-generic signature), so scoring many
        # artifacts and the golden vectors does not retrace per call.
        ids = tf.TensorSpec([None, None], tf.int32)
        signature = {name: ids for name in ("token_ids", "segment_ids", "padding_mask")}

        @tf.function(input_signature=[signature])
        def call(x):
            if crf:
                x = dict(x, label_mask=x["padding_mask"])
            outputs = model(x, training=False)
            return outputs["logits"] if crf else outputs

        def predict(x):
            x = {name: tf.constant(np.asarray(x[name], "int32")) for name in signature}
            return keras.ops.convert_to_numpy(call(x))

        return predict

    # --- steps --------------------------------------------------------------------------

    def _calibration_batches(self):
        """Training examples padded to the export length, in batches of 8."""
        count = self.options.quantization.calibration_examples
        return [model_inputs_at_length(x, self.length) for x in self.task.input_batches(count)]

    def _quantization_aware_model(self):
        """The QAT model: of `options.qat_run`, or made by the quantize stage in
        `OUTPUT/qat` (`keras_attn.quantization.quantize_stage.quantize_run`; a CRF tagger's
        is calibrated, its emissions converted like the float tagger's)."""
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
                                       self.length, self.log, task=self.task)
        except RunDirectoryError as error:
            raise ExportError(str(error)) from None
        self.recipe = recipe
        return qat_run.load_model()

    def _tflite(self, qat):
        wanted = [v for v in TFLITE_FLOAT_VARIANTS + ("int8",)
                  if not (self.output_dir / f"model_{v}.tflite").is_file()]
        if qat is None and "int8" in wanted:
            wanted.remove("int8")
        calibration = self._calibration_batches()
        float_variants = [v for v in wanted if v != "int8"]
        if float_variants:
            self.log(f"TFLite {', '.join(float_variants)} (batch 1, length {self.length})")
            export_tflite(self.model, self.output_dir, float_variants, self.length,
                          representative_data=calibration)
        if "int8" in wanted:
            self.log("TFLite int8 from the QAT model")
            export_tflite(qat, self.output_dir, ["int8"], self.length,
                          representative_data=calibration)
        variants = TFLITE_FLOAT_VARIANTS + (("int8",) if qat is not None else ())
        reports = {v: tflite_op_report(self.output_dir / f"model_{v}.tflite") for v in variants}
        for variant in self._tflite_buckets(qat, calibration):
            reports[f"{variant}_buckets"] = tflite_op_report(
                self.output_dir / bucketed_file_name(variant))
        return reports

    @property
    def bucket_lengths(self):
        """The signature lengths of the bucketed files, derived from the options."""
        return bucket_lengths(self.length, self.options.smallest_bucket)

    def _bucket_variants(self, qat):
        """The variants written with length buckets (none for one bucket)."""
        if not self.options.length_buckets or len(self.bucket_lengths) == 1:
            return ()
        return tuple(v for v in BUCKET_VARIANTS if v != "int8" or qat is not None)

    def _tflite_buckets(self, qat, calibration):
        """`model_<variant>_buckets.tflite` (`keras_attn.export.length_buckets`)."""
        variants = self._bucket_variants(qat)
        wanted = [v for v in variants if not (self.output_dir / bucketed_file_name(v)).is_file()]
        for model, group in ((self.model, [v for v in wanted if v != "int8"]),
                             (qat, [v for v in wanted if v == "int8"])):
            if group:
                self.log(f"TFLite {', '.join(group)} with length buckets {self.bucket_lengths}")
                export_tflite(model, self.output_dir, group, self.length,
                              representative_data=calibration, buckets=self.bucket_lengths)
        return variants

    def _onnx(self):
        path = self.output_dir / "model.onnx"
        if not path.is_file():
            self.log("ONNX (opset 17, dynamic batch and sequence)")
            # A CRF tagger exports its emissions (`logits`); Viterbi runs outside the graph.
            export_onnx(self.model, path, opset=17)
        quantized = self.output_dir / "model_dynamic_int8.onnx"
        if not quantized.is_file():
            quantize_onnx_dynamic(path, quantized)

    def _saved_model(self):
        directory = self.output_dir / "saved_model"
        if not (directory / "saved_model.pb").is_file():
            self.log("SavedModel for TF Serving (text in)")
            export_saved_model(self.model, self._tokenizer(), self.task.labels, directory)

    def _text_tflite(self):
        path = self.output_dir / "model_text.tflite"
        if not path.is_file():
            self.log("TFLite with the tokenizer inside (tf-text custom ops)")
            export_text_tflite(self.model, self._tokenizer(), path)

    def _tokenizer(self):
        return self.source.tokenizer(self.length)

    # --- measurements -------------------------------------------------------------------

    def _tflite_runner(self, path):
        # Each example on the shortest length bucket that holds it (a fixed-length file has
        # one: its length).
        runner = BucketedTFLite(Interpreter(model_path=str(path), num_threads=2))

        def predict(x):
            return np.stack([runner({k: v[b:b + 1] for k, v in x.items()})[0]
                             for b in range(len(x["token_ids"]))])

        return predict

    def _tflite_call(self, path, threads, x):
        runner = Interpreter(model_path=str(path), num_threads=threads).get_signature_runner()
        return lambda: runner(**x)

    def _onnx_call(self, path, threads, x):
        runner = OnnxRunner(str(path), threads=threads)
        feed = runner.feed({k: v for k, v in x.items() if k in runner.input_names})
        return lambda: runner.session.run(runner.output_names, feed)

    def _interleaved_latency(self, calls):
        """`{name: [percentiles per thread count]}` of `calls` (`{name: threads -> call}`).

        Per thread count the artifacts take turns: `latency_runs` timed runs each (after 5
        warm-up runs), in up to `LATENCY_ROUNDS` rounds, so a busy moment of a shared machine
        lands on every artifact alike and the ratios between them hold (as in
        `benchmarks/tflite_interleaved_latency.py`).
        """
        results = {name: [] for name in calls}
        rounds = np.array_split(np.arange(self.options.latency_runs),
                                min(LATENCY_ROUNDS, self.options.latency_runs))
        for threads in self.options.latency_threads:
            ready = {name: make(threads) for name, make in calls.items()}
            for call in ready.values():
                for _ in range(5):
                    call()
            times = {name: [] for name in ready}
            for runs in rounds:
                for name, call in ready.items():
                    for _ in runs:
                        start = time.perf_counter()
                        call()
                        times[name].append((time.perf_counter() - start) * 1000)
            for name in ready:
                results[name].append({**_percentiles(times[name]), "num_threads": threads})
        return results

    def _length_buckets(self, variants):
        """The report's `length_buckets` section: fixed vs bucketed latency, interleaved,
        1 thread, over up to `LATENCY_EXAMPLES` evaluation examples sampled at random."""
        if not variants:
            return None
        rng = np.random.default_rng(0)
        count = min(LATENCY_EXAMPLES, len(self.examples))
        sample = [self.examples[i] for i in sorted(rng.choice(len(self.examples), count,
                                                              replace=False))]
        inputs = [model_inputs_at_length(self.task.collate([e])[0], self.length)
                  for e in sample]
        tokens = [int(x["padding_mask"].sum()) for x in inputs]
        self.log(f"length buckets: latency over {count} evaluation examples, fixed vs "
                 "bucketed, interleaved")
        latency = {v: bucket_latency(self.output_dir / f"model_{v}.tflite",
                                     self.output_dir / bucketed_file_name(v), inputs)
                   for v in variants}
        first = next(iter(latency.values()))
        return {"lengths": list(self.bucket_lengths), "examples": count,
                "tokens_p50": float(np.median(tokens)), "tokens_mean": float(np.mean(tokens)),
                "bucket_counts": first["bucket_counts"], "num_threads": first["num_threads"],
                "cpu": cpu_description(), "latency": latency}

    def _latency_input(self):
        example = max(self.examples, key=lambda e: len(e["token_ids"]))
        x = self.task.collate([example])[0]
        return model_inputs_at_length(x, self.length)

    # --- side files ---------------------------------------------------------------------

    def _model_card(self, rows, qat):
        quantization = qat and {"recipe": self.recipe.to_dict(),
                                "description": self.recipe.describe()}
        card = model_card(
            self.task.name, list(self.task.labels.labels), self.length, self._tokenizer(),
            lowercase=self.tokenizer_settings.lowercase, metric=self.task.metric,
            crf=self._crf_section(),
            metrics={r["artifact"]: r.get("metric") for r in rows},
            source_run=str(self.run_dir.resolve()), version=_version(),
            quantization=quantization or None)
        write_model_card(self.output_dir / "model_card.json", card)

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
        texts = list(HARD_CASES) + self._data_texts(self.options.golden_examples)
        # A CRF tagger's emissions; its tags are decoded from the card's transitions.
        predict = self._keras_predict(self.model)
        return write_golden_vectors(
            self.output_dir / "golden_vectors.jsonl", texts, self.task.name, self._tokenizer(),
            predict, list(self.task.labels.labels), crf=self._crf_section())

    def _data_texts(self, limit):
        """Raw texts of the evaluation file (CoNLL sentences joined with spaces)."""
        if limit == 0:
            return []
        if self.tagger:
            return [" ".join(s.tokens) for _, s in zip(range(limit),
                                                       ConllReader(self.eval_file))]

        data = self.config.data
        reader = ClassificationReader(self.eval_file, text_column=data.text_column,
                                      label_column=data.label_column, header=data.header)
        return [e.text for _, e in zip(range(limit), reader)]

    def _crf_tags(self, logits, word_ids):
        """Viterbi tags of `(B, S, C)` emissions over each word's first piece, with the float
        model's CRF weights."""
        crf = self.model.get_layer("crf")
        tags = viterbi_decode(np.asarray(logits, "float32"), crf.transitions,
                              crf.start_transitions, crf.end_transitions,
                              mask=first_piece_mask(word_ids))
        return keras.ops.convert_to_numpy(tags)

    # --- the run ------------------------------------------------------------------------

    def run(self):
        started = time.perf_counter()
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self._load()
        for name in ("vocab.txt", "labels.txt"):
            shutil.copyfile(self.run_dir / name, self.output_dir / name)

        qat = self._quantization_aware_model()
        op_reports = self._tflite(qat)
        self._onnx()
        self._saved_model()
        text_error = None
        if self.options.text_tflite:
            try:
                self._text_tflite()
            except (ValueError, RuntimeError) as error:
                text_error = str(error).splitlines()[0]
                self.log(f"model_text.tflite not written: {text_error}")

        self.log(f"evaluating every artifact on {len(self.examples):,} {self.eval_split} "
                 "examples")
        rows = self._evaluate_all(qat)
        for row in rows:
            if row["artifact"].endswith(".tflite") and row["artifact"] != "model_text.tflite":
                variant = row["artifact"][len("model_"):-len(".tflite")]
                row["ops"] = op_reports[variant]["ops"]
                row["non_int8_ops"] = op_reports[variant]["non_int8_ops"]
        self._model_card(rows, qat)
        golden = self._golden_vectors()
        length_buckets = self._length_buckets(self._bucket_variants(qat))
        # --- issue 23: metadata in every .tflite; MediaPipe files of a classifier ---------

        self_describing = self_describing_artifacts(
            self.output_dir, self.model, self._tokenizer(),
            list(HARD_CASES) + self._data_texts(len(self.examples)), self.log)
        # --- end of issue 23 ----------------------------------------------------------------
        report = {
            "source_run": str(self.run_dir.resolve()), "task": self.task.name,
            "metric": self.task.metric, "eval_split": self.eval_split,
            "eval_examples": len(self.examples), "sequence_length": self.length,
            "artifacts": rows, "golden_vectors": golden,
            "model_text_tflite_error": text_error,
            "self_describing_tflite": self_describing,  # issue 23
            "length_buckets": length_buckets,  # issue 24
            "machine": _machine(), "seconds": round(time.perf_counter() - started, 1),
            "quantization": qat and self.recipe.to_dict(),
            "options": {name: list(value) if isinstance(value, tuple) else value  # as JSON
                        for name, value in dataclasses.asdict(self.options).items()},
        }
        (self.output_dir / "export_report.json").write_text(
            json.dumps(report, indent=1) + "\n", encoding="utf-8")
        (self.output_dir / "export_report.md").write_text(report_markdown(report),
                                                           encoding="utf-8")
        self.log(f"wrote {self.output_dir / 'export_report.md'}")
        return report

    def _evaluate_all(self, qat):
        reference = self._collect(self._keras_predict(self.model))
        rows = [{"artifact": "model.keras (float, Keras)", "path": str(self.run_dir /
                                                                       "model.keras"),
                 "size_bytes": _directory_size(self.run_dir / "model.keras"),
                 "metric": self._score(reference)[self.task.metric],
                 "agreement": 1.0, "max_abs_logit_diff": 0.0}]

        calls = {}  # artifact -> (threads -> a timed call), timed together at the end
        timed_input = self._latency_input()  # one input for every timed call

        def add(name, path, predict, call=None):
            self.log(f"  {name}")
            outputs = self._collect(predict)
            rows.append({"artifact": name, "path": str(path),
                         "size_bytes": _directory_size(path),
                         "metric": self._score(outputs)[self.task.metric],
                         **self._compare(outputs, reference)})
            if call is not None:
                calls[name] = call

        if qat is not None:
            add("QAT model (Keras, fake int8)", self.output_dir / "qat" / "model.keras",
                self._keras_predict(qat))
        variants = TFLITE_FLOAT_VARIANTS[:3] + (("int8",) if qat is not None else ()) + \
            ("int8_ptq",)
        for variant in variants:
            path = self.output_dir / f"model_{variant}.tflite"
            add(f"model_{variant}.tflite", path, self._tflite_runner(path),
                lambda t, p=path: self._tflite_call(p, t, timed_input))
        for variant in self._bucket_variants(qat):  # latency: the length-bucket section
            path = self.output_dir / bucketed_file_name(variant)
            add(path.name, path, self._tflite_runner(path))
        for name in ("model.onnx", "model_dynamic_int8.onnx"):
            path = self.output_dir / name
            runner = OnnxRunner(str(path), threads=2)
            add(name, path,
                lambda x, r=runner: r({k: v for k, v in x.items() if k in r.input_names}),
                lambda t, p=path: self._onnx_call(p, t, timed_input))
        saved = load_saved_model(self.output_dir / "saved_model").signatures["predict_ids"]
        add("saved_model/ (predict_ids)", self.output_dir / "saved_model",
            # A CRF signature also takes `label_mask`, which only its `tags` output reads.
            lambda x: saved(**x, **({"label_mask": x["padding_mask"]} if self.use_crf
                                    else {}))["logits"].numpy())
        self.log(f"latency of {len(calls)} artifacts, interleaved, "
                 f"{self.options.latency_runs} runs each per thread count")
        latency = self._interleaved_latency(calls)
        for row in rows:
            if row["artifact"] in latency:
                row["latency"] = latency[row["artifact"]]
        return rows


def _version():
    return __version__


def _machine():
    return {"cpu": cpu_description(), "cpu_count": os.cpu_count(), "tensorflow": tf.__version__,
            "keras": keras.__version__}


def _qat_description(report):
    """The line of the report saying how the QAT model was made (from the recipe, or the
    options of reports written before the recipe was recorded)."""
    recorded = report.get("quantization")
    legacy = report.get("options") or {}
    if recorded is None and "qat_epochs" in legacy:
        names = {f.name for f in dataclasses.fields(QuantizationRecipe)}
        recorded = {k: v for k, v in legacy.items() if k in names}
    if recorded is None:
        return []
    recipe = QuantizationRecipe.from_dict(recorded)
    return [f"QAT model (`model_int8.tflite`): {recipe.describe()}.", ""]


def report_markdown(report):
    """The report as a Markdown page: the artifact table, latencies and op histograms."""
    metric = report["metric"]
    float_row = report["artifacts"][0]
    float_size = next((r["size_bytes"] for r in report["artifacts"]
                       if r["artifact"] == "model_fp32.tflite"), None)
    threads = sorted({lat["num_threads"] for r in report["artifacts"]
                      for lat in r.get("latency", [])})
    float_latency = {lat["num_threads"]: lat["p50_ms"] for r in report["artifacts"]
                     if r["artifact"] == "model_fp32.tflite" for lat in r.get("latency", [])}
    lines = [
        f"# Export report: {report['task']}",
        "",
        f"Source run `{report['source_run']}`; {metric} on {report['eval_examples']:,} "
        f"{report['eval_split']} examples; sequence length {report['sequence_length']}; "
        f"{report['machine']['cpu']}, {report['machine']['cpu_count']} cores; TensorFlow "
        f"{report['machine']['tensorflow']}, Keras {report['machine']['keras']}.",
        "",
        *_qat_description(report),
        "Agreement: top-1 (classification) or per-token argmax (NER) equal to the Keras "
        "float model's; max |Δlogit| over real tokens. Latency: one batch-1 inference "
        "(LiteRT with XNNPACK; onnxruntime), p50 / p90 ms, the artifacts timed in turns.",
        "",
        f"| artifact | {metric} | Δ vs float | agreement | max \\|Δlogit\\| | size | "
        "% of fp32 | " + " | ".join(f"{t} thread{'s' if t > 1 else ''} p50 / p90 (× fp32)"
                                   for t in threads) + " |",
        "| --- " * (7 + len(threads)) + "|",
    ]
    for row in report["artifacts"]:
        cells = [f"`{row['artifact']}`", f"{row['metric']:.4f}",
                 f"{row['metric'] - float_row['metric']:+.4f}", f"{row['agreement']:.4f}",
                 f"{row['max_abs_logit_diff']:.2e}", f"{row['size_bytes'] / 1e6:.1f} MB",
                 f"{100 * row['size_bytes'] / float_size:.0f} %" if float_size else "—"]
        by_threads = {lat["num_threads"]: lat for lat in row.get("latency", [])}
        for t in threads:
            lat = by_threads.get(t)
            ratio = f" ({lat['p50_ms'] / float_latency[t]:.2f}×)" \
                if lat and t in float_latency else ""
            cells.append(f"{lat['p50_ms']:.2f} / {lat['p90_ms']:.2f}{ratio}" if lat else "—")
        lines.append("| " + " | ".join(cells) + " |")
    int8 = next((r for r in report["artifacts"] if r["artifact"] == "model_int8.tflite"), None)
    if int8 is not None:
        lines += ["", "## Ops of `model_int8.tflite` that are not int8", ""]
        if int8["non_int8_ops"]:
            lines += [f"- `{op}` × {count}" for op, count in int8["non_int8_ops"].items()]
        else:
            lines.append("None: every op runs in integer arithmetic.")
    lines += ["", "## Op histograms", ""]
    for row in report["artifacts"]:
        if "ops" in row:
            ops = ", ".join(f"{op} {count}" for op, count in row["ops"].items())
            lines.append(f"- `{row['artifact']}`: {ops}")
    lines += self_describing_markdown(report.get("self_describing_tflite"))  # issue 23
    lines += buckets_markdown(report.get("length_buckets"))  # issue 24
    if report.get("model_text_tflite_error"):
        lines += ["", f"`model_text.tflite` was not written: {report['model_text_tflite_error']}"]
    lines.append("")
    return "\n".join(lines)


def export_run(run_dir, output_dir, options=None, log=None):
    """Exports a trained run; see `RunExporter`. Returns the report dict."""
    return RunExporter(run_dir, output_dir, options, log).run()
