"""`quantize_onnx_static`: onnxruntime's own static (calibrated) int8 of a float ONNX file,
the post-training baseline of the calibrated twin's QDQ file (`export_onnx_qdq`)."""

import logging
import os

import numpy as np
import onnx

from keras_attn import atomic_files
from keras_attn.export.onnx.onnx_quantization import batched_weight_matmuls
from keras_attn.export.onnx.onnx_quantization import drop_pre_processing_advice
from keras_attn.export.onnx.onnx_quantization import gemm_as_matmul

# The ops quantized: every matmul (weights and attention) and the embedding lookups. With
# onnxruntime's default (every op type it knows) the LayerNorm means that tf2onnx writes
# as GlobalAveragePool become QLinearGlobalAveragePool, which fails at run time
# ("parameter out of computation range") on a BERT classifier.
QUANTIZED_OP_TYPES = ("MatMul", "Gather")


def quantize_onnx_static(src, dst, batches, per_channel=True):
    """Writes onnxruntime's static int8 (QDQ) version of a float ONNX model.

    `onnxruntime.quantization.quantize_static` in QDQ format with its defaults for x86:
    uint8 activations, int8 weights (U8S8), MinMax calibration (each quantized tensor's
    range is `[min, max]` over the calibration batches, widened to hold 0) of the inputs of the
    `QUANTIZED_OP_TYPES`: every MatMul (the weights' and the attention's) and the
    embedding lookups. The attention projections' `Gemm` are first rewritten as
    `MatMul` + `Add`, as for `quantize_onnx_dynamic`.

    Args:
        src: str or path-like, the float ONNX model (from `export_onnx`).
        dst: str or path-like, the int8 model to write (not `src`).
        batches: non-empty list of input dicts of `(B, L)` int arrays (keys other than the
            graph's inputs are ignored), e.g. an export's calibration batches.
        per_channel: bool, one weight scale per output channel. Defaults to `True`.

    Returns:
        str, `dst`.

    Raises:
        ValueError: `src` missing, `src` and `dst` the same file, or no batches.

    Example:
    >>> import tempfile
    >>> from keras_attn.export.onnx.onnx_runner import OnnxRunner
    >>> from keras_attn.export.onnx.onnx_export import export_onnx
    >>> from keras_attn.models.bert_backbone import BertBackbone
    >>> from keras_attn.models.bert_classifier import BertClassifier
    >>> classifier = BertClassifier(BertBackbone(
    ...     vocabulary_size=50, num_layers=1, num_heads=2, hidden_dim=8,
    ...     intermediate_dim=16, max_sequence_length=16), num_classes=3)
    >>> directory = tempfile.mkdtemp()
    >>> src = export_onnx(classifier, os.path.join(directory, "model.onnx"))["path"]
    >>> x = {"token_ids": np.array([[2, 7, 9, 0]]), "segment_ids": np.zeros((1, 4), "int32"),
    ...      "padding_mask": np.array([[1, 1, 1, 0]])}
    >>> dst = quantize_onnx_static(src, os.path.join(directory, "ptq.onnx"), [x])
    >>> OnnxRunner(dst)(x).shape
    (1, 3)
    """
    batches = _checked_arguments(src, dst, batches)
    # Imported on use: onnxruntime's quantization tools take ~1.8 s to import (see
    # `quantize_onnx_dynamic`).
    from onnxruntime.quantization import CalibrationDataReader
    from onnxruntime.quantization import QuantFormat
    from onnxruntime.quantization import QuantType
    from onnxruntime.quantization import quantize_static

    model_proto = gemm_as_matmul(onnx.load(os.fspath(src)))
    inputs = {i.name: i.type.tensor_type.elem_type for i in model_proto.graph.input}

    class Batches(CalibrationDataReader):
        def __init__(self):
            self.rows = iter([
                {name: np.asarray(batch[name]).astype(
                    onnx.helper.tensor_dtype_to_np_dtype(elem)) for name, elem in inputs.items()}
                for batch in batches
            ])

        def get_next(self):
            return next(self.rows, None)

    root = logging.getLogger()
    root.addFilter(drop_pre_processing_advice)
    try:
        with atomic_files.atomic_path(dst) as temporary:
            quantize_static(model_proto, os.fspath(temporary), Batches(),
                            quant_format=QuantFormat.QDQ, activation_type=QuantType.QUInt8,
                            weight_type=QuantType.QInt8, per_channel=per_channel,
                            op_types_to_quantize=list(QUANTIZED_OP_TYPES),
                            nodes_to_exclude=batched_weight_matmuls(model_proto))
    finally:
        root.removeFilter(drop_pre_processing_advice)
    return os.fspath(dst)


def _checked_arguments(src, dst, batches):
    """`batches` as a list, after checking the three arguments of `quantize_onnx_static`."""
    if not isinstance(src, (str, os.PathLike)) or not os.path.isfile(src):
        raise ValueError(f"`src` must be an existing ONNX file. Received: src={src!r}")
    if not isinstance(dst, (str, os.PathLike)) or (
            os.path.abspath(os.fspath(src)) == os.path.abspath(os.fspath(dst))):
        raise ValueError("`dst` must be a path other than `src`. "
                         f"Received: src={src!r}, dst={dst!r}")
    batches = list(batches)
    if not batches:
        raise ValueError("`batches` must hold at least one input dict (the calibration "
                         "data). Received: batches=[]")
    return batches
