"""`ExportOptions`, the settings of `keras-attn export` (each declared once, its flag made
from the declaration), and `ExportError`."""

import dataclasses

from keras_attn.errors import KerasAttnError
from keras_attn.export.tflite.tflite_export import SMALLEST_BUCKET
from keras_attn.layers.validation import check_int
from keras_attn.layers.validation import check_positive_int
from keras_attn.runs.config_schema import setting
from keras_attn.runs.quantization_recipe import QuantizationRecipe

GOLDEN_DATA_EXAMPLES = 1000
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

    sequence_length: int | None = setting(
        None, minimum=1, help="fixed input length of the mobile artifacts (default: the run's "
                              "data.max_length)")
    quantization: QuantizationRecipe = dataclasses.field(default_factory=QuantizationRecipe)
    qat_run: str | None = setting(
        None, metavar="QAT_RUN",
        help="convert this QAT run (from `keras-attn quantize`, or a quantization-aware "
             "`keras-attn train` run continuing RUN_DIR) instead of quantizing RUN_DIR into "
             "OUTPUT/qat")
    eval_split: str = setting("auto", choices=EVAL_SPLITS,
                              help="data the artifacts are scored on (auto: test for NER, dev "
                                   "for classification)")
    max_eval_examples: int | None = setting(None, minimum=1,
                                            help="score on the first N examples only")
    latency_threads: tuple = setting((1, 2), nargs="+", parse=int, minimum=1,
                                     help="thread counts of the latency measurements")
    latency_runs: int = setting(50, minimum=1, help="timed runs per latency measurement")
    text_tflite: bool = setting(
        True, help="skip model_text.tflite (tokenizer inside, tf-text custom ops)")
    golden_examples: int = setting(
        GOLDEN_DATA_EXAMPLES, help="data sentences in golden_vectors.jsonl (plus the hard cases)")
    length_buckets: bool = setting(
        True, help="skip model_<variant>_buckets.tflite (one signature per length bucket) and "
                   "its latency over the evaluation lengths")
    smallest_bucket: int = setting(
        SMALLEST_BUCKET, minimum=1,
        help="the shortest length bucket of model_<variant>_buckets.tflite")

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
