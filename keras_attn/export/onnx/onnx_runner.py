"""`OnnxRunner`: an ONNX file on onnxruntime, called like the Keras model it came from."""

import os

import numpy as np
import onnxruntime

from keras_attn.layers.validation import check_int


class OnnxRunner:
    """Runs an ONNX model in onnxruntime on the dict of arrays a Keras model takes.

    Integer inputs of another width than the graph's (e.g. numpy's default int64 for
    int32 graph inputs) are converted when every value fits, float inputs to the
    graph's float type; a float given for an integer input (or the reverse), a value
    out of range, a missing or unknown input name, or a wrong rank raises a
    `ValueError`.

    Args:
        path: str or path-like, the ONNX file.
        threads: int, onnxruntime intra-op threads, or `None` for onnxruntime's default
            (one per physical core). Inter-op parallelism is off (sequential execution),
            so `threads` is the number of threads that compute. Defaults to `None`.

    Call arguments:
        inputs: dict from input name to array-like (numpy, `tf.Tensor`, list).

    Returns:
        The output as a numpy array for a single-output graph (e.g. `(B, C)` logits),
        else a dict from output name to numpy array.

    Example:
    >>> import tempfile
    >>> from keras_attn.export.onnx.onnx_export import export_onnx
    >>> from keras_attn.models.bert_backbone import BertBackbone
    >>> from keras_attn.models.bert_classifier import BertClassifier
    >>> classifier = BertClassifier(BertBackbone(
    ...     vocabulary_size=50, num_layers=1, num_heads=2, hidden_dim=8,
    ...     intermediate_dim=16, max_sequence_length=16), num_classes=3)
    >>> path = os.path.join(tempfile.mkdtemp(), "model.onnx")
    >>> runner = OnnxRunner(export_onnx(classifier, path)["path"], threads=1)
    >>> x = {"token_ids": np.array([[2, 7, 9, 0]]), "segment_ids": np.zeros((1, 4), "int32"),
    ...      "padding_mask": np.array([[1, 1, 1, 0]])}
    >>> bool(np.abs(runner(x) - classifier.predict(x, verbose=0)).max() < 1e-5)
    True
    """

    def __init__(self, path, threads=None):
        if not isinstance(path, (str, os.PathLike)) or not os.path.isfile(path):
            raise ValueError(f"`path` must be an existing ONNX file. Received: path={path!r}")
        check_int("threads", threads, low=1, optional=True)

        options = onnxruntime.SessionOptions()
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
        options.inter_op_num_threads = 1
        if threads is not None:
            options.intra_op_num_threads = threads
        self.path = os.fspath(path)
        self.threads = threads
        self.session = onnxruntime.InferenceSession(
            self.path, options, providers=["CPUExecutionProvider"]
        )
        self._inputs = {i.name: i for i in self.session.get_inputs()}
        self.input_names = list(self._inputs)
        self.output_names = [o.name for o in self.session.get_outputs()]

    def __call__(self, inputs):
        feed = self.feed(inputs)
        results = self.session.run(self.output_names, feed)
        if len(results) == 1:
            return results[0]
        return dict(zip(self.output_names, results))

    def feed(self, inputs):
        """The checked dict of numpy arrays handed to `session.run` (validation only
        once when timing `session.run(runner.output_names, feed)` in a loop)."""
        if not isinstance(inputs, dict):
            raise ValueError(
                f"OnnxRunner takes a dict from input name to array (inputs: "
                f"{self.input_names}). Received: inputs={type(inputs).__name__}"
            )
        unknown = sorted(set(inputs) - set(self._inputs))
        if unknown:
            raise ValueError(
                f"Unknown input name(s) {unknown} for {self.path}: the graph's inputs are "
                f"{self.input_names}. Received: inputs with keys {sorted(inputs)}"
            )
        missing = [name for name in self.input_names if name not in inputs]
        if missing:
            raise ValueError(
                f"Missing input(s) {missing} for {self.path}: the graph's inputs are "
                f"{self.input_names}. Received: inputs with keys {sorted(inputs)}"
            )
        return {name: self._array(name, inputs[name]) for name in self.input_names}

    def _array(self, name, value):
        spec = self._inputs[name]
        expected = _ORT_TYPES.get(spec.type)
        if expected is None:
            raise ValueError(f"OnnxRunner does not feed inputs of type {spec.type} ({name}).")
        array = np.asarray(value)
        if array.ndim != len(spec.shape):
            raise ValueError(
                f"Input '{name}' must have rank {len(spec.shape)} (shape {spec.shape}). "
                f"Received: {name} with shape {array.shape}"
            )
        if array.dtype == expected:
            return array
        same_kind = (np.issubdtype(array.dtype, np.integer) and np.issubdtype(expected, np.integer)
                     ) or (np.issubdtype(array.dtype, np.floating)
                           and np.issubdtype(expected, np.floating))
        if not same_kind:
            raise ValueError(
                f"Input '{name}' must hold {np.dtype(expected).name} values (the ONNX graph's "
                f"{spec.type}). Received: {name} with dtype {array.dtype}"
            )
        converted = array.astype(expected)
        if np.issubdtype(expected, np.integer) and not np.array_equal(converted, array):
            raise ValueError(
                f"Input '{name}' has values that do not fit the graph's "
                f"{np.dtype(expected).name}. Received: {name} with dtype {array.dtype}, "
                f"range [{array.min()}, {array.max()}]"
            )
        return converted


_ORT_TYPES = {
    "tensor(int32)": np.int32,
    "tensor(int64)": np.int64,
    "tensor(float)": np.float32,
    "tensor(double)": np.float64,
    "tensor(float16)": np.float16,
}
