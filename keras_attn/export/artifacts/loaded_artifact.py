"""A model file of an export opened by its runtime: what `keras-attn predict` (and any other
reader) needs of it without knowing the export's runtime modules.

`load_artifact(path)` opens a `.tflite` file (LiteRT, with the tf-text custom ops registered
for `model_text.tflite`) or an `.onnx` file (onnxruntime) and returns a `LoadedArtifact`:
its kind (`"tflite"`, `"text_tflite"`, `"onnx"`), input names, logits shape, how to run it
(`run_logits` on token ids, or `run_text` on one string) and the model card embedded in the
file, if any. The export scores its files with the same runners (`tflite_logits`,
`onnx_logits`).
"""

import dataclasses
import pathlib

import numpy as np

from keras_attn.errors import KerasAttnError
from keras_attn.errors import first_line
from keras_attn.export.artifacts.onnx_artifacts import onnx_logits
from keras_attn.export.artifacts.tflite_artifacts import tflite_logits
from keras_attn.export.onnx.onnx_metadata import onnx_settings
from keras_attn.export.onnx.onnx_runner import OnnxRunner
from keras_attn.export.text_tflite import text_interpreter
from keras_attn.export.tflite.tflite_metadata import TFLiteMetadataError
from keras_attn.export.tflite.tflite_metadata import settings_from_tflite
from keras_attn.export.tflite.tflite_runtime import default_signature_runner


class ArtifactLoadError(KerasAttnError, ValueError):
    """A model file its runtime cannot open, or whose embedded model card is damaged."""


@dataclasses.dataclass
class LoadedArtifact:
    """One opened model file.

    Attributes:
        path: `pathlib.Path` of the file.
        kind: `"tflite"` (token ids in), `"text_tflite"` (one string in) or `"onnx"`.
        input_names: the graph's input names.
        output_shapes: `{output name: shape list}` (`-1` or a name for dynamic axes).
        run_logits: `x -> logits` (`x`: dict of `(B, L)` int32 arrays) for ids-in files.
        run_text: `text -> {output name: array}` for `model_text.tflite`.
        length: the fixed sequence length of an ids-in TFLite file (else `None`).
    """

    path: pathlib.Path
    kind: str
    input_names: tuple
    output_shapes: dict
    run_logits: object = None
    run_text: object = None
    length: int = None
    _embedded_card: object = None

    def embedded_card(self):
        """The `ModelCard` embedded in the file, or `None` when it has none."""
        try:
            return self._embedded_card()
        except TFLiteMetadataError as error:
            raise ArtifactLoadError(str(error)) from None


def load_artifact(path, num_threads=None):
    """Opens a `.tflite` or `.onnx` model file.

    Args:
        path: str or path-like.
        num_threads: int, CPU threads of the runtime (`None`: 1 for LiteRT, onnxruntime's
            default for ONNX).

    Returns:
        `LoadedArtifact`.

    Raises:
        ArtifactLoadError: the runtime cannot open the file (the runtime's message first line).

    Example:
    >>> load_artifact("nowhere/model.onnx")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    keras_attn.export.artifacts.loaded_artifact.ArtifactLoadError: nowhere/model.onnx: ...
    """
    path = pathlib.Path(path)
    if path.suffix.lower() == ".tflite":
        return _load_tflite(path, num_threads or 1)
    if path.suffix.lower() == ".onnx":
        return _load_onnx(path, num_threads)
    raise ArtifactLoadError(f"{path}: not a .tflite or .onnx file")


def _load_tflite(path, num_threads):
    try:
        interpreter = text_interpreter(path, num_threads=num_threads)
    except (ValueError, RuntimeError) as error:
        raise ArtifactLoadError(f"{path}: LiteRT cannot load it ({first_line(error)})") \
            from None
    runner = default_signature_runner(interpreter)
    inputs = runner.get_input_details()
    outputs = {name: list(detail["shape"])
               for name, detail in runner.get_output_details().items()}
    loaded = LoadedArtifact(path, "tflite", tuple(inputs), outputs,
                            _embedded_card=lambda: settings_from_tflite(path))
    if set(inputs) == {"text"}:
        loaded.kind = "text_tflite"
        loaded.run_text = lambda text: runner(text=np.array([text.encode("utf-8")],
                                                            dtype=object))
    elif "token_ids" in inputs:
        loaded.run_logits = tflite_logits(interpreter)
        loaded.length = int(inputs["token_ids"]["shape"][1])
    return loaded


def _load_onnx(path, num_threads):
    try:
        runner = OnnxRunner(str(path), threads=num_threads)
    except Exception as error:  # noqa: BLE001 - onnxruntime's InvalidProtobuf, Fail, ...
        raise ArtifactLoadError(f"{path}: onnxruntime cannot load it ({first_line(error)}); "
                                "re-run `keras-attn export`") from None
    outputs = {o.name: list(o.shape) for o in runner.session.get_outputs()}
    return LoadedArtifact(path, "onnx", tuple(runner.input_names), outputs,
                          run_logits=onnx_logits(runner),
                          _embedded_card=lambda: onnx_settings(runner.session, path))

