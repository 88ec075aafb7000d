"""Stores each distinct quantization-parameter table of a `.tflite` flatbuffer once.

The converter stores constant buffers once however many signatures use them, but every
subgraph has its own tensor table, and each tensor its own `QuantizationParameters`: for a
per-channel int8 weight that is one float32 scale and one int64 zero point per output
channel, 12 bytes a channel, written again in every subgraph that uses the weight
(measured on MiniLM-L6, 21,122 channels: 253 KB per signature in dynamic int8, 509 KB in
full int8, where the biases' and activations' tables add the rest). A length-bucketed file
(`export_tflite(..., buckets=...)`) has one subgraph per bucket, so this was most of its
growth over the fixed-length file (SST-2 int8 with buckets [16, 32, 64]: +5.1 %).

A FlatBuffer may reference one table from many places; `share_quantization_parameters`
rewrites the model with each distinct table written once and every tensor with those
values pointing at it. Nothing else changes: the rewritten model unpacks to the same
`ModelT` (tensors, buffers, operators, signatures), so the interpreter computes the same
outputs bit for bit. Constant buffers start at multiples of 16 bytes, as the schema asks
(`force_align: 16`; the converter's own output does not always, and `flatbuffer_utils`
aligns to 1).
"""

import flatbuffers
import numpy as np
from tensorflow.lite.python import schema_py_generated as schema

TFLITE_FILE_IDENTIFIER = b"TFL3"
# The schema's `force_align: 16` on `Buffer.data`.
BUFFER_ALIGNMENT = 16


class _SharedQuantization(schema.QuantizationParametersT):
    """A `QuantizationParametersT` packed once per builder, then referenced."""

    def __init__(self, params, packed):
        super().__init__()
        for name in ("min", "max", "scale", "zeroPoint", "detailsType", "details",
                     "quantizedDimension"):
            setattr(self, name, getattr(params, name))
        self._packed = packed  # id(self) -> offset in the builder

    def Pack(self, builder):  # noqa: N802 (the generated object API's name)
        if id(self) not in self._packed:
            self._packed[id(self)] = super().Pack(builder)
        return self._packed[id(self)]


class _AlignedBuffer(schema.BufferT):
    """A `BufferT` whose data starts at a multiple of `BUFFER_ALIGNMENT` bytes (the
    generated `BufferT.Pack` aligns to 1)."""

    def __init__(self, buffer):
        super().__init__()
        self.data, self.offset, self.size = buffer.data, buffer.offset, buffer.size

    def Pack(self, builder):  # noqa: N802
        data = None
        if self.data is not None and len(self.data):
            payload = np.asarray(self.data, np.uint8)
            # Padding so that the vector's data, written next, starts aligned.
            builder.Prep(BUFFER_ALIGNMENT, payload.size)
            data = builder.CreateNumpyVector(payload)
        schema.BufferStart(builder)
        if data is not None:
            schema.BufferAddData(builder, data)
        schema.BufferAddOffset(builder, self.offset)
        schema.BufferAddSize(builder, self.size)
        return schema.BufferEnd(builder)


def _values(params):
    """The content of a quantization table, as a hashable key."""
    def array(values):
        return None if values is None else (np.asarray(values).dtype.str,
                                            np.asarray(values).tobytes())
    return (array(params.min), array(params.max), array(params.scale),
            array(params.zeroPoint), params.quantizedDimension)


def share_quantization_parameters(content):
    """The `.tflite` model `content` with each distinct quantization table stored once.

    Args:
        content: bytes of a `.tflite` flatbuffer, as `TFLiteConverter.convert()` returns
            (without associated files appended: they are not part of the flatbuffer).

    Returns:
        bytes of the same model, smaller by the repeated tables (unchanged in meaning:
        it unpacks to an equal `schema.ModelT`).

    Example (the export's conversion worker does this to every file it writes):

        content = share_quantization_parameters(converter.convert())
    """
    return pack_model(schema.ModelT.InitFromObj(
        schema.Model.GetRootAsModel(bytearray(content), 0)))


def pack_model(model):
    """Serializes a `schema.ModelT` with each distinct quantization table stored once and
    constant buffers aligned: `flatbuffer_utils.convert_object_to_bytearray` without the
    repeated tables (`embed_metadata` writes its files with it, so they stay shared).

    Args:
        model: `schema.ModelT` (left unchanged).

    Returns:
        bytes of the `.tflite` flatbuffer.
    """
    packed, shared, originals = {}, {}, []
    for subgraph in model.subgraphs or []:
        for tensor in subgraph.tensors or []:
            params = tensor.quantization
            if params is None or params.details is not None:  # custom details: left as is
                continue
            key = _values(params)
            if key not in shared:
                shared[key] = _SharedQuantization(params, packed)
            originals.append((tensor, params))
            tensor.quantization = shared[key]
    buffers = model.buffers
    model.buffers = [_AlignedBuffer(buffer) for buffer in buffers or []]
    try:
        builder = flatbuffers.Builder(1024)
        builder.Finish(model.Pack(builder), file_identifier=TFLITE_FILE_IDENTIFIER)
        return bytes(builder.Output())
    finally:
        model.buffers = buffers
        for tensor, params in originals:
            tensor.quantization = params
