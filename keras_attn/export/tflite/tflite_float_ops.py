"""Runs chosen int8 ops of a `.tflite` model in float: the ops XNNPACK has no int8 kernel for.

XNNPACK, LiteRT's CPU delegate, runs int8 `FULLY_CONNECTED` / `CONV_2D` (on VNNI or ARM
dot-product instructions, 3x faster than fp32 here) but not int8 `BATCH_MATMUL`, `SOFTMAX`,
`GELU` or `SELECT_V2`: in a full-int8 BERT those (the attention products, the softmax, the
feed-forward activation and the padding mask) fall back to LiteRT's builtin kernels and cut
XNNPACK's graph into pieces. Measured on the demo's MiniLM-L6 (length 48, 1 thread, AMD EPYC
with AVX-512 VNNI): fp32 24.8 ms, dynamic-range int8 7.5 ms, full int8 12.9 ms (14 XNNPACK
partitions); with those ops in float 7.6 ms and 8 partitions, as many as the fp32 file.

`run_in_float` rewrites each such int8 op `y = f(x)` as

    x_f = DEQUANTIZE(x);  y_f = f(x_f) in float;  y = QUANTIZE(y_f)   (y keeps its scale)

and then drops every round trip from float to int8 and back (`QUANTIZE` then `DEQUANTIZE`
of the same tensor), where float ops read a float value through int8: `softmax(Q K^T)` and
`probabilities x V` stay float from one to the other, and the residual sum reads the float
LayerNorm output that the next int8 matmul reads quantized; a float value quantized and
then requantized to another scale is quantized once, to the second.
The weight matmuls keep their int8 inputs and outputs. The function is the int8 model's
with some roundings left out: each rewritten op computes exactly on its dequantized inputs
where the int8 kernel approximates (lookup tables, fixed-point exponentials), and a dropped
round trip skips one rounding to the tensor's int8 grid. Constant int8 inputs (the masked
score of `SELECT_V2`) become float constants of the same value.
"""

import numpy as np
from ai_edge_litert.interpreter import Interpreter
from tensorflow.lite.python import schema_py_generated as schema

from keras_attn.export.tflite.tflite_sharing import pack_model

# The int8 ops of our graphs that XNNPACK (LiteRT 2.x) leaves to the builtin kernels.
XNNPACK_INT8_GAPS = ("BATCH_MATMUL", "SOFTMAX", "GELU", "SELECT_V2")
# What `run_in_float` computes in float by default: those, and the pooler's TANH, whose
# int8 kernel rounds to a fixed 1/128 grid before the requantization to the tensor's own
# scale (measured 0.0043 on MiniLM): a rounding the calibrated Keras model does not have.
FLOAT_OPS = XNNPACK_INT8_GAPS + ("TANH",)

_INT8, _FLOAT32, _BOOL = schema.TensorType.INT8, schema.TensorType.FLOAT32, schema.TensorType.BOOL


def run_in_float(content, op_names=FLOAT_OPS):
    """The `.tflite` model `content` with its int8 `op_names` ops computed in float.

    Args:
        content: bytes of a `.tflite` flatbuffer with int8 ops (any number of subgraphs).
        op_names: builtin operator names (e.g. `"SOFTMAX"`). An op is rewritten when every
            input and output that is not boolean is int8 with one scale (per tensor).

    Returns:
        bytes of the rewritten model (the same signatures, inputs and outputs).

    Example:

        content = run_in_float(converter.convert())  # what the export worker does
    """
    builtins = {_builtin(name) for name in op_names}
    model = schema.ModelT.InitFromObj(schema.Model.GetRootAsModel(bytearray(content), 0))
    rewriter = _Rewriter(model, builtins)
    for subgraph in model.subgraphs or []:
        rewriter.rewrite(subgraph)
    return pack_model(model)


def xnnpack_partitions(model, num_threads=1):
    """How many pieces XNNPACK takes of a `.tflite` model's main graph (its DELEGATE nodes):
    more than the fp32 file's means ops left to LiteRT's builtin kernels in between.

    Args:
        model: path of a `.tflite` file, or its bytes.
        num_threads: int, the interpreter's threads.

    Returns:
        int.
    """
    source = ({"model_content": bytes(model)} if isinstance(model, (bytes, bytearray))
              else {"model_path": str(model)})
    interpreter = Interpreter(**source, num_threads=num_threads)
    interpreter.allocate_tensors()
    return sum(op["op_name"] == "DELEGATE" for op in interpreter._get_ops_details())


def _builtin(name):
    code = getattr(schema.BuiltinOperator, name, None)
    if code is None or name.startswith("_"):
        raise ValueError(f"{name!r} is not a TFLite builtin operator name (e.g. 'SOFTMAX'). "
                         f"Received: op_names containing {name!r}")
    return code


class _Rewriter:
    """Rewrites the subgraphs of one `schema.ModelT` in place."""

    def __init__(self, model, builtins):
        self.model = model
        self.builtins = builtins
        self.quantize = self._opcode("QUANTIZE")
        self.dequantize = self._opcode("DEQUANTIZE")

    def _opcode(self, name):
        """The index of `name`'s operator code, added (version 2: int8) if missing."""
        builtin = _builtin(name)
        for index, code in enumerate(self.model.operatorCodes):
            if max(code.builtinCode, code.deprecatedBuiltinCode) == builtin:
                return index
        code = schema.OperatorCodeT()
        code.builtinCode, code.deprecatedBuiltinCode, code.version = builtin, min(builtin, 127), 2
        self.model.operatorCodes.append(code)
        return len(self.model.operatorCodes) - 1

    def rewrite(self, subgraph):
        self.subgraph = subgraph
        self.floats = {}  # int8 tensor -> the float tensor holding its value
        operators = []
        for op in subgraph.operators:
            if self._selected(op):
                operators += self._in_float(op)
            else:
                operators.append(op)
        subgraph.operators = self._without_round_trips(operators)

    def _selected(self, op):
        code = self.model.operatorCodes[op.opcodeIndex]
        if max(code.builtinCode, code.deprecatedBuiltinCode) not in self.builtins:
            return False
        tensors = [self.subgraph.tensors[t] for t in _indices(op.inputs) + _indices(op.outputs)]
        real = [t for t in tensors if t.type != _BOOL]
        return bool(real) and all(t.type == _INT8 and _per_tensor(t) for t in real)

    def _in_float(self, op):
        """`[DEQUANTIZE ..., op in float, QUANTIZE ...]` for one selected op."""
        added = []
        inputs = []
        for index in _indices(op.inputs, keep_absent=True):
            if index < 0 or self.subgraph.tensors[index].type != _INT8:
                inputs.append(index)
                continue
            if index not in self.floats:
                self.floats[index] = self._float_input(index, added)
            inputs.append(self.floats[index])
        outputs, requantize = [], []
        for index in _indices(op.outputs):
            value = self._float_tensor(index, "float")
            self.floats[index] = value
            outputs.append(value)
            requantize.append(_operator(self.quantize, [value], [index]))
        op.inputs, op.outputs = _vector(inputs), _vector(outputs)
        return added + [op] + requantize

    def _float_input(self, index, added):
        """The float tensor of int8 input `index`: a float constant, or a DEQUANTIZE."""
        tensor = self.subgraph.tensors[index]
        data = self.model.buffers[tensor.buffer].data
        if data is not None and len(data):
            q = tensor.quantization
            values = ((np.frombuffer(bytes(data), np.int8).astype(np.float32)
                       - q.zeroPoint[0]) * np.float32(q.scale[0])).astype(np.float32)
            buffer = schema.BufferT()
            buffer.data = np.frombuffer(values.tobytes(), np.uint8)
            self.model.buffers.append(buffer)
            return self._float_tensor(index, "float", len(self.model.buffers) - 1)
        value = self._float_tensor(index, "dequantized")
        added.append(_operator(self.dequantize, [index], [value]))
        return value

    def _float_tensor(self, like, suffix, buffer=0):
        """A new float32 tensor shaped like tensor `like` (buffer 0: no data)."""
        source = self.subgraph.tensors[like]
        tensor = schema.TensorT()
        tensor.shape, tensor.shapeSignature = source.shape, source.shapeSignature
        tensor.type, tensor.buffer = _FLOAT32, buffer
        tensor.name = (source.name or b"") + b"/" + suffix.encode()
        self.subgraph.tensors.append(tensor)
        return len(self.subgraph.tensors) - 1

    def _without_round_trips(self, operators):
        """Readers of `DEQUANTIZE(QUANTIZE(f))` read the float `f`, a requantization
        `QUANTIZE(QUANTIZE(f))` (int8 to int8) quantizes `f` once; a QUANTIZE nobody reads
        then goes too."""
        tensors = self.subgraph.tensors
        quantized = {int(op.outputs[0]): int(op.inputs[0]) for op in operators
                     if op.opcodeIndex == self.quantize and tensors[op.inputs[0]].type == _FLOAT32}
        outputs = {int(i) for i in self.subgraph.outputs}
        alias, kept = {}, []
        for op in operators:
            source = int(op.inputs[0]) if op.opcodeIndex in (self.quantize,
                                                             self.dequantize) else None
            if (op.opcodeIndex == self.dequantize and source in quantized
                    and int(op.outputs[0]) not in outputs):
                alias[int(op.outputs[0])] = quantized[source]
                continue
            if op.opcodeIndex == self.quantize and source in quantized:
                op.inputs = _vector([quantized[source]])  # the float value, rounded once
            kept.append(op)
        for op in kept:
            op.inputs = _vector([alias.get(i, i) for i in _indices(op.inputs, keep_absent=True)])
        read = {i for op in kept for i in _indices(op.inputs)} | outputs
        return [op for op in kept if not (op.opcodeIndex == self.quantize
                                          and int(op.outputs[0]) in quantized
                                          and int(op.outputs[0]) not in read)]


def _indices(vector, keep_absent=False):
    """Tensor indices of an operator's inputs or outputs (-1: an absent optional input)."""
    values = [] if vector is None else [int(i) for i in vector]
    return values if keep_absent else [i for i in values if i >= 0]


def _vector(indices):
    return np.array(indices, np.int32)


def _per_tensor(tensor):
    q = tensor.quantization
    return q is not None and q.scale is not None and len(q.scale) == 1


def _operator(opcode, inputs, outputs):
    op = schema.OperatorT()
    op.opcodeIndex, op.inputs, op.outputs = opcode, _vector(inputs), _vector(outputs)
    return op
