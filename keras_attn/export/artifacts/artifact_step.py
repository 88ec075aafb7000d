"""What one kind of artifact is to `keras-attn export`: the files it writes, how it writes
them, and how its files are run (scored by the export, and by `keras-attn predict`).

Adding a kind of artifact = one module with an `ArtifactStep` subclass and one line in
`keras_attn.export.artifacts.ARTIFACT_STEPS` (docs/pipeline.md shows the smallest one).
"""

import abc
import dataclasses
import pathlib


@dataclasses.dataclass(frozen=True)
class ArtifactFile:
    """One file (or directory) an export writes, as the model card lists it.

    Attributes:
        file: its name in the export directory.
        kind: the runtime format (`"tflite"`, `"onnx"`, `"saved_model"`, `"text_tflite"`).
        precision: `"fp32"`, `"fp16"`, `"dynamic_int8"`, `"int8"` (the calibrated recipe) or
            `"int8_ptq"`.
        lengths: the sequence lengths of its signatures (`()`: any length).
        source: the Keras model it converts: `"float"`, or `"int8"` for the calibrated twin.
        scored: whether the export scores it against the Keras float model (a report row).
        timed: whether its batch-1 latency is measured with the other timed artifacts.
        row: its name in the report (default: `file`).
    """

    file: str
    kind: str
    precision: str
    lengths: tuple = ()
    source: str = "float"
    scored: bool = True
    timed: bool = False
    row: str = None

    @property
    def report_name(self):
        return self.row or self.file

    def card_entry(self):
        """Its entry in the model card's `artifacts` list."""
        return {"file": self.file, "kind": self.kind, "precision": self.precision,
                "lengths": list(self.lengths)}


@dataclasses.dataclass
class ExportPlan:
    """What every step is given: the models, the lengths and the options of one export.

    Attributes:
        output_dir: the export directory (`pathlib.Path`).
        model: the float Keras task model.
        int8_model: its calibrated (or quantization-aware) twin, or `None`.
        length: the fixed sequence length of the mobile artifacts.
        bucket_lengths: the signature lengths of the bucketed files.
        calibration: input batches padded to `length` (the int8 converters' data).
        tokenizer: the export's `WordPieceTokenizer`.
        labels: the `LabelVocabulary`.
        options: the `ExportOptions`.
        log: callable receiving progress lines.
    """

    output_dir: pathlib.Path
    model: object
    int8_model: object
    length: int
    bucket_lengths: tuple
    calibration: list
    tokenizer: object
    labels: object
    options: object
    log: object

    @property
    def use_crf(self):
        return bool(getattr(self.model, "use_crf", False))


class ArtifactStep(abc.ABC):
    """One kind of artifact. `name` keys it in the registry and in errors."""

    name = None
    optional = False  # True: a failed conversion is reported, and the export goes on

    @abc.abstractmethod
    def files(self, plan):
        """The `ArtifactFile`s this step writes for `plan` (`[]`: none for this export)."""

    @abc.abstractmethod
    def write(self, plan, files):
        """Writes `files` (those of `self.files(plan)` not yet in the export directory)."""

    def is_written(self, path):
        """Whether the artifact at `path` is there (a re-run reuses it)."""
        return path.is_file()

    def run_logits(self, path, num_threads=2):
        """`x -> logits` of the file at `path` (`x`: dict of `(B, L)` int32 id arrays),
        as the export scores it; `None` for a kind that is not scored."""
        return None

    def timed_call(self, path, num_threads, x):
        """A no-argument call running the file once on `x` (batch 1), for the latency; only
        asked of the files a step lists with `timed=True`."""
        raise ValueError(f"{path}: {self.name} artifacts are not timed; a step that lists a "
                         "file with timed=True defines timed_call")

    def details(self, path):
        """Extra fields of the file's report row (e.g. op histograms)."""
        return {}
