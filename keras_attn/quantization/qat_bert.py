"""`QatBert`: the quantization-aware twin of `BertClassifier` / `BertTokenClassifier`,
in the layout of the int8 TFLite graph."""

import keras
import numpy as np
from keras import ops

from keras_attn.checkpoints.bert_weights import BERT_EMBEDDING_WEIGHT_NAMES
from keras_attn.checkpoints.bert_weights import BERT_POOLER_WEIGHT_NAMES
from keras_attn.checkpoints.bert_weights import bert_block_weight_names
from keras_attn.checkpoints.bert_weights import bert_weight_targets
from keras_attn.layers.activation_quantizer import ActivationQuantizer
from keras_attn.layers.crf import CRF
from keras_attn.layers.feedforward_float_channels import ChannelRanges
from keras_attn.layers.int8_layout_settings import MATMULS
from keras_attn.layers.int8_layout_settings import check_feedforward_float_channels
from keras_attn.layers.quantized_dense import QuantizedDense
from keras_attn.layers.quantized_dense import check_weight_quantization
from keras_attn.layers.transformer_block_base import serialize_activation
from keras_attn.layers.validation import check_bool
from keras_attn.layers.validation import check_positive_int
from keras_attn.layers.validation import check_rate
from keras_attn.models.bert_backbone import BertBackbone
from keras_attn.models.bert_classifier import BertClassifier
from keras_attn.models.bert_token_classifier import BertTokenClassifier
from keras_attn.models.bert_token_classifier import crf_loss
from keras_attn.models.model_arguments import check_transformer_sizes
from keras_attn.models.model_config import ModelConfig
from keras_attn.quantization.qat_embeddings import QatEmbeddings
from keras_attn.quantization.qat_encoder_block import QatEncoderBlock
from keras_attn.quantization.quantization_ops import check_float_ops
from keras_attn.quantization.quantization_ops import op_weight_count
from keras_attn.quantization.quantization_ops import quantization_ops

HEADS = ("classification", "token_classification")

# Layers of a float BERT task model, by name, that `from_float` maps (or that hold no
# weights); anything else is refused with its name.
_BACKBONE_LAYERS = ("token_ids", "segment_ids", "padding_mask", "embeddings",
                    "embeddings_layer_norm", "embeddings_dropout", "pooled_dense")
_INPUT_NAMES = ("token_ids", "segment_ids", "padding_mask")
_CRF_WEIGHTS = ("transitions", "start_transitions", "end_transitions")
_HEAD_LAYERS = ("token_ids", "segment_ids", "padding_mask", "label_mask", "output_dropout",
                "logits", "crf")


@keras.saving.register_keras_serializable(package="keras_attn")
class QatBert(ModelConfig, keras.Model):
    """BERT task model for quantization-aware training and full-int8 TFLite export
    (Jacob et al., 2018; BERT: Devlin et al., 2019).

    An export-oriented re-expression of `BertClassifier` (`head="classification"`:
    `logits = W Dropout(tanh(W_p h_[CLS] + b_p)) + b`, `(B, num_outputs)`) and
    `BertTokenClassifier` (`head="token_classification"`: `(B, T, num_outputs)`): the
    same function with the same weights (`from_float` maps them, `to_float` writes them
    back), built from `QatEmbeddings`, `QatEncoderBlock` and `QuantizedDense`, whose
    graphs are the int8 TFLite layout (2-D matmuls, reshape/transpose heads, batched
    matmuls, GATHER embeddings; the classification head's last block computes only the
    [CLS] query row) with every activation fake-quantized once where it is
    produced (`ActivationQuantizer`, EMA ranges) and weights fake-quantized symmetrically,
    per output channel by default.

    With `quantize=False` the same graph runs in float: equal to the float model's logits
    (up to float rounding), the source of the float and post-training-quantized TFLite
    artifacts.

    With `use_crf=True` (the twin of `BertTokenClassifier(use_crf=True)`) the emission
    network is quantized as above and a float linear-chain `CRF` (Lample et al., 2016)
    decodes its logits: the model takes `label_mask` too and returns
    `{"logits", "tags"}` like the float CRF tagger. Its int8 TFLite model holds the
    emissions only (`emissions_model`); Viterbi runs outside the graph with the
    transitions. It trains like the float CRF tagger: compile with only an optimizer and
    pass the `(B, T)` labels (`-100` where no tag) as `y` (`compute_loss`, the CRF loss).

    Ranges must be set before the model is used quantized: train it (`fit`), or call
    `calibrate` on a few batches.

    Args:
        vocabulary_size, num_layers, num_heads, hidden_dim, intermediate_dim,
        max_sequence_length, num_segments, dropout, activation, layer_norm_epsilon: the
            `BertBackbone` arguments.
        num_outputs: int, classes (or tags).
        head: `"classification"` or `"token_classification"`. Defaults to
            `"classification"`.
        output_dropout: float, dropout before the output layer. Defaults to `0.1`.
        weight_quantization: `"per_channel"` or `"per_tensor"`. Defaults to
            `"per_channel"`.
        quantize: bool, fake quantization on. Defaults to `True`.
        float_residual: bool, keep the residual sums and the LayerNorm internals in float
            (embeddings and every block; see `QatEncoderBlock`): every weight matmul
            stays int8, and the int8 TFLite model runs ADD and LayerNorm in float (and the
            ops XNNPACK has no int8 kernel for, `export.tflite_float_ops`). Defaults to
            `False` (everything int8).
        feedforward_float_channels: int: in each block, this many feed-forward hidden
            channels, the widest by calibrated range (`calibrate` finds them), run in
            float and the rest in int8 (see `QatEncoderBlock`). Above 0 needs
            `float_residual=True`. Defaults to `0`.
        use_crf: bool, a CRF on the token logits (`head="token_classification"` only).
            Defaults to `False`.
        float_ops: names of `quantization_ops` computed in float: the whole embeddings,
            pooler or output layer, or one weight matmul of a block with the rounding of
            its input and output (a block with all four float is float); each layer
            rounds its output only for an int8 next matmul. What an int8 accuracy budget chooses
            (`quantization_budget`). Defaults to `()`.
        decay: float, EMA factor of the activation ranges. Defaults to `0.999`.
        attention_mask_margin: float, nats between the lowest real attention score and
            padded keys in int8 (see `ActivationQuantizer`). Defaults to `12.0`.
        masked_score: float, score of padded keys when `quantize=False`. Defaults to
            `-1e9` (exact); `-20.0` for graphs the TFLite converter calibrates.
        **kwargs: `keras.Model` arguments (`name`, `trainable`).

    Inputs:
        A dict of `(B, T)` ints: `token_ids`, `segment_ids`, `padding_mask`; with
        `use_crf`, also `label_mask` (1 at the tokens whose tag is decoded).

    Returns:
        Logits `(B, num_outputs)` or `(B, T, num_outputs)`; with `use_crf`, a dict:
        `logits` (the emissions) and `tags`, the `(B, T)` int32 Viterbi path over
        `label_mask`.

    Example:
    >>> backbone = BertBackbone(vocabulary_size=50, num_layers=1, num_heads=2,
    ...                         hidden_dim=8, intermediate_dim=16, max_sequence_length=16)
    >>> qat = QatBert.from_float(BertClassifier(backbone, num_classes=3))
    >>> x = {"token_ids": np.array([[2, 7, 9, 0]]), "segment_ids": np.zeros((1, 4), "int32"),
    ...      "padding_mask": np.array([[1, 1, 1, 0]])}
    >>> qat.calibrate([x])
    >>> tuple(qat(x).shape)
    (1, 3)
    """

    def __init__(self, vocabulary_size, num_layers, num_heads, hidden_dim, intermediate_dim,
                 num_outputs, head="classification", max_sequence_length=512,
                 num_segments=2, dropout=0.1, activation="gelu", layer_norm_epsilon=1e-12,
                 output_dropout=0.1, weight_quantization="per_channel", quantize=True,
                 decay=0.999, attention_mask_margin=12.0, masked_score=-1e9,
                 float_residual=False, feedforward_float_channels=0, use_crf=False,
                 float_ops=(), **kwargs):
        _check_arguments(locals())
        if not isinstance(activation, str):
            activation = serialize_activation(activation)
        float_ops = check_float_ops(float_ops, quantization_ops(num_layers, head))
        int8, consumers = _int8_ops(float_ops, quantize, num_layers, head)
        common = dict(decay=decay)

        # === Layers ===
        embeddings = QatEmbeddings(
            vocabulary_size, max_sequence_length, num_segments, hidden_dim,
            layer_norm_epsilon, float_residual=float_residual, name="embeddings",
            quantize=int8["embeddings"], quantize_output=int8[consumers[0]], **common,
        )
        embeddings_dropout = keras.layers.Dropout(dropout, name="embeddings_dropout")
        blocks = [
            QatEncoderBlock(
                num_heads, intermediate_dim, dropout=dropout, activation=activation,
                layer_norm_epsilon=layer_norm_epsilon,
                weight_quantization=weight_quantization,
                attention_mask_margin=attention_mask_margin, masked_score=masked_score,
                float_residual=float_residual,
                feedforward_float_channels=feedforward_float_channels,
                float_matmuls=[m for m in MATMULS
                               if f"transformer_layer_{i}/{m}" in float_ops],
                # A block with every matmul float is float (all-int8 recipe: its residual
                # roundings too), so that every op float is the float model.
                quantize=any(int8[f"transformer_layer_{i}/{m}"] for m in MATMULS),
                quantize_output=int8[consumers[i + 1]],
                name=f"transformer_layer_{i}", **common,
            )
            for i in range(num_layers)
        ]
        pooled_dense = None
        if head == "classification":
            pooled_dense = QuantizedDense(
                hidden_dim, activation="tanh", weight_quantization=weight_quantization,
                name="pooled_dense", quantize=int8["pooled_dense"],
                quantize_output=int8["logits"], **common,
            )
        head_dropout = keras.layers.Dropout(output_dropout, name="output_dropout")
        logits_dense = QuantizedDense(
            num_outputs, weight_quantization=weight_quantization, name="logits",
            quantize=int8["logits"], **common
        )
        crf = CRF(num_outputs, name="crf") if use_crf else None  # float, like the tagger's

        # === Functional Model ===
        inputs = {
            name: keras.Input(shape=(None,), dtype="int32", name=name) for name in _INPUT_NAMES
        }
        x = embeddings(inputs["token_ids"], inputs["segment_ids"])  # (B, T, H)
        x = embeddings_dropout(x)
        # The classification head reads only [CLS]: the last block computes that one row.
        classify = head == "classification"
        cls_state, sequence = _encode(blocks, x, inputs["padding_mask"], classify)
        x = pooled_dense(cls_state) if classify else sequence  # (B, H) or (B, T, H)
        logits = logits_dense(head_dropout(x))  # (B, C) or (B, T, C)
        outputs = logits
        if use_crf:
            inputs["label_mask"] = keras.Input(shape=(None,), dtype="int32", name="label_mask")
            tags = crf(logits, mask=ops.cast(inputs["label_mask"], "bool"))  # (B, T) int32
            outputs = {"logits": logits, "tags": tags}
        super().__init__(inputs=inputs, outputs=outputs, **kwargs)

        # === Config ===
        self.store_arguments(locals())
        self.crf = crf

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        """With `use_crf`: the float CRF tagger's loss (`crf_loss`); without: the compiled
        loss (Keras' default)."""
        if not self.use_crf:
            return super().compute_loss(x, y, y_pred, sample_weight, training)
        return crf_loss(self, y, y_pred, sample_weight)

    # === Quantizers and calibration ===

    @property
    def activation_quantizers(self):
        """Every `ActivationQuantizer` of the model, in graph order."""
        found = []

        def visit(layer):
            if isinstance(layer, ActivationQuantizer):
                found.append(layer)
            for sublayer in layer._flatten_layers(include_self=False, recursive=False):
                visit(sublayer)

        for layer in self.layers:
            visit(layer)
        return found

    def uncalibrated_quantizers(self):
        """Paths of the quantizers whose range was never set (neither trained nor
        calibrated): exporting to int8 needs none."""
        return [q.path for q in self.activation_quantizers if float(q.initialized.numpy()) < 0.5]

    def layout_differences(self, float_residual, feedforward_float_channels):
        """`(name, this model's value, asked value)` for each quantizer-layout argument
        that differs from the one asked for (empty when they agree): a QAT model's ranges
        were learned for its own layout, so a caller asking for another must not reuse it."""
        asked = {"float_residual": float_residual,
                 "feedforward_float_channels": feedforward_float_channels}
        return [(name, getattr(self, name), value) for name, value in asked.items()
                if getattr(self, name) != value]

    def calibrate(self, batches):
        """Sets the activation ranges from forward passes in inference mode (no dropout).

        Each batch updates every range like a training step (EMA, the first batch
        initializes it) — the quick way to get ranges for post-training int8 or to start
        QAT from sensible ranges. With `feedforward_float_channels` > 0, a first float
        pass over the same batches sorts each block's feed-forward channels by their
        range (the width `max - min` of the up-projection output), widest last, unless
        that block's ranges are already set.

        Args:
            batches: iterable of input dicts (or `(inputs, labels)` pairs); keys other
                than the model's inputs are ignored. A CRF model without `label_mask`
                in a batch decodes over its `padding_mask` (the ranges are the
                emission network's: the mask changes only the tags).
        """
        inputs = [self._model_inputs(batch[0] if isinstance(batch, (tuple, list)) else batch)
                  for batch in batches]
        if not inputs:
            raise ValueError("`calibrate` needs at least one batch. Received: batches=[]")
        self._sort_feedforward_channels(inputs)
        quantizers = self.activation_quantizers
        for quantizer in quantizers:
            quantizer.calibrating = True
        try:
            for x in inputs:
                self(x, training=False)
        finally:
            for quantizer in quantizers:
                quantizer.calibrating = False

    def _model_inputs(self, batch):
        """The model's inputs of `batch`, a dict of arrays (a CRF model's `label_mask`
        defaults to `padding_mask`)."""
        inputs = {k: v for k, v in batch.items() if k in _INPUT_NAMES}
        if self.use_crf:
            inputs["label_mask"] = batch.get("label_mask", batch["padding_mask"])
        return inputs

    def _blocks(self):
        return [self.get_layer(f"transformer_layer_{i}") for i in range(self.num_layers)]

    def _sort_feedforward_channels(self, inputs):
        if not self.feedforward_float_channels:
            return
        # A block whose ranges are set keeps its order (the ranges belong to it).
        blocks = [block for block in self._blocks() if float(
            block.quantizers["intermediate_quantizer"].initialized.numpy()) < 0.5]
        if not blocks:
            return
        # The float twin gives the float model's activations before any range is set.
        twin = self.with_quantization(False)
        statistics = {block.name: ChannelRanges() for block in blocks}
        for name, ranges in statistics.items():
            twin.get_layer(name).channel_statistics = ranges
        for x in inputs:
            twin(x, training=False)
        for block in blocks:
            widths = statistics[block.name].widths()
            block.permute_feedforward_channels(np.argsort(widths, kind="stable"))

    def freeze_ranges(self, frozen=True):
        """Makes every activation and weight range a constant of the traced graph
        (`frozen=True`, what export does before tracing: the TFLite converter turns a
        FakeQuant into int8 scales only when its min/max fold to constants) or reads
        them from the variables again (`frozen=False`, after further training)."""
        for layer in self._flatten_layers(include_self=False):
            if hasattr(layer, "freeze_weight_ranges"):
                layer.freeze_weight_ranges(frozen)
        for quantizer in self.activation_quantizers:
            quantizer.frozen_range = (
                (float(quantizer.min_value.numpy()), float(quantizer.max_value.numpy()))
                if frozen else None
            )
        # The biases are then rounded as the file stores them (`int32_bias`).
        for layer, producer in self._input_quantizers():
            layer.frozen_input_step = producer.step() if frozen and producer.quantize else None

    def _input_quantizers(self):
        """`(layer, quantizer of its int8 input)` of each layer whose first matmul reads
        another layer's output."""
        blocks = self._blocks()
        outputs = [self.get_layer("embeddings").quantizers["layer_norm_quantizer"]] + [
            block.quantizers["feedforward_layer_norm_quantizer"] for block in blocks]
        pairs = list(zip(blocks, outputs))
        if self.head == "classification":
            pooled = self.get_layer("pooled_dense")
            pairs += [(pooled, outputs[-1]), (self.get_layer("logits"),
                                              pooled.activation_quantizer)]
        else:
            pairs.append((self.get_layer("logits"), outputs[-1]))
        return pairs

    def with_quantization(self, quantize, **overrides):
        """A copy of this model with `quantize` switched (and other config `overrides`,
        e.g. `masked_score`), same weights and ranges."""
        config = {**self.get_config(), "quantize": quantize, **overrides}
        twin = QatBert.from_config(config)
        twin.set_weights(self.get_weights())
        return twin

    def quantization_ops(self):
        """The names of this model's ops that `float_ops` can list (`quantization_ops`)."""
        return quantization_ops(self.num_layers, self.head)

    def op_weight_count(self, op):
        """How many weights op `op` stores in int8 (`quantization_ops.op_weight_count`)."""
        return op_weight_count(self, op)

    def with_float_ops(self, float_ops):
        """A copy of this model (same weights and ranges) computing `float_ops` in float,
        the others as this model's recipe does."""
        return self.with_quantization(self.quantize, float_ops=list(float_ops))

    def emissions_model(self):
        """The network a TFLite file holds: this model itself, or for a CRF model a copy
        without the CRF (same weights and ranges) whose output is the
        emissions `logits` and whose inputs are the three `(B, T)` id tensors; the tags
        are decoded outside it (Viterbi with this model's `crf` transitions)."""
        if not self.use_crf:
            return self
        twin = QatBert.from_config({**self.get_config(), "use_crf": False})
        for layer in twin.layers:
            layer.set_weights(self.get_layer(layer.name).get_weights())
        return twin

    # === Float model <-> QAT model ===

    @classmethod
    def from_float(cls, model, **kwargs):
        """The QAT twin of a float `BertClassifier` or `BertTokenClassifier`, with its
        weights copied.

        Args:
            model: the float task model (a `BertTokenClassifier(use_crf=True)` gives a
                `use_crf=True` twin with the same CRF transitions).
            **kwargs: `QatBert` arguments (`quantize`, `weight_quantization`, `decay`, ...;
                `use_crf=False` maps a CRF tagger's emission network only).
        """
        if isinstance(model, BertClassifier):
            head, num_outputs = "classification", model.num_classes
        elif isinstance(model, BertTokenClassifier):
            head, num_outputs = "token_classification", model.num_labels
            kwargs.setdefault("use_crf", model.use_crf)
            if kwargs["use_crf"] and not model.use_crf:
                raise ValueError("QatBert.from_float(use_crf=True) needs a tagger with a CRF: "
                                 f"{model.name} has none. Received: use_crf=True")
        else:
            raise ValueError(
                "QatBert.from_float maps a BertClassifier or a BertTokenClassifier. "
                f"Received: model={type(model).__name__}"
            )
        backbone = model.backbone
        _check_mappable(model, backbone)
        qat = cls(
            vocabulary_size=backbone.vocabulary_size, num_layers=backbone.num_layers,
            num_heads=backbone.num_heads, hidden_dim=backbone.hidden_dim,
            intermediate_dim=backbone.intermediate_dim, num_outputs=num_outputs, head=head,
            max_sequence_length=backbone.max_sequence_length,
            num_segments=backbone.num_segments, dropout=backbone.dropout,
            activation=backbone.activation, layer_norm_epsilon=backbone.layer_norm_epsilon,
            output_dropout=model.dropout, **kwargs,
        )
        for (target, value) in _weight_pairs(qat, model):
            target.assign(_to_qat_layout(target, value))
        return qat

    def to_float(self, model=None):
        """Writes this model's (QAT-trained) weights into a float task model.

        Args:
            model: optional float `BertClassifier` / `BertTokenClassifier` of the same
                architecture to write into; by default a new one (fused Q/K/V) is built.

        Returns:
            The float model, whose logits equal this model's with `quantize=False`.
        """
        if model is None:
            backbone = BertBackbone(
                vocabulary_size=self.vocabulary_size, num_layers=self.num_layers,
                num_heads=self.num_heads, hidden_dim=self.hidden_dim,
                intermediate_dim=self.intermediate_dim,
                max_sequence_length=self.max_sequence_length,
                num_segments=self.num_segments, dropout=self.dropout,
                activation=self.activation, layer_norm_epsilon=self.layer_norm_epsilon,
            )
            if self.head == "classification":
                model = BertClassifier(backbone, self.num_outputs, dropout=self.output_dropout)
            else:
                model = BertTokenClassifier(backbone, self.num_outputs,
                                            dropout=self.output_dropout, use_crf=self.use_crf)
        expected = BertClassifier if self.head == "classification" else BertTokenClassifier
        if not isinstance(model, expected):
            raise ValueError(
                f"A QatBert with head={self.head!r} writes into a {expected.__name__}. "
                f"Received: model={type(model).__name__}"
            )
        if getattr(model, "use_crf", False) != self.use_crf:
            raise ValueError(
                f"A QatBert with use_crf={self.use_crf} writes into a BertTokenClassifier "
                f"with the same `use_crf`. Received: use_crf={model.use_crf}"
            )
        _check_mappable(model, model.backbone)
        unpermuted = {}
        for block in self._blocks():
            unpermuted.update(block.float_order_feedforward_weights())
        for (source, target) in _weight_pairs(self, model):
            if tuple(source.shape) != tuple(np.shape(_to_qat_layout(source, target))):
                raise ValueError(
                    f"Weight {target.path} has shape {tuple(target.shape)}, which does not "
                    f"match {source.path} {tuple(source.shape)}: build the float model with "
                    "the QAT model's sizes."
                )
            value = unpermuted.get(source.path)
            if value is None:
                value = ops.convert_to_numpy(source)
            target.assign(np.reshape(value, _float_shape(target)))
        return model


def _int8_ops(float_ops, quantize, num_layers, head):
    """`({op: int8?}, consumers)`: an op is int8 unless listed, and `consumers[i]` is the
    op reading layer `i`'s output (the embeddings, then each block), whose int8-ness
    decides whether that layer rounds its output."""
    int8 = {op: quantize and op not in float_ops for op in quantization_ops(num_layers, head)}
    consumers = [f"transformer_layer_{i}/qkv" for i in range(num_layers)] + [
        "pooled_dense" if head == "classification" else "logits"]
    return int8, consumers


def _check_arguments(a):
    """`QatBert.__init__`'s argument checks (`a`: its arguments by name)."""
    check_transformer_sizes(a["vocabulary_size"], a["num_layers"], a["num_heads"],
                            a["hidden_dim"], a["intermediate_dim"])
    check_positive_int("num_outputs", a["num_outputs"])
    head = a["head"]
    if head not in HEADS:
        raise ValueError(f"`head` must be one of {HEADS}. Received: head={head!r}")
    check_rate("dropout", a["dropout"])
    check_rate("output_dropout", a["output_dropout"])
    check_weight_quantization(a["weight_quantization"])
    check_bool("quantize", a["quantize"])
    check_bool("float_residual", a["float_residual"])
    check_feedforward_float_channels(a["feedforward_float_channels"], a["intermediate_dim"],
                                     a["float_residual"])
    check_bool("use_crf", a["use_crf"])
    if a["use_crf"] and head != "token_classification":
        raise ValueError("`use_crf` decodes token tags: it needs "
                         f"head='token_classification'. Received: head={head!r}")


def _encode(blocks, x, padding_mask, classify):
    """`encode` of the QAT blocks, each residual sum reading the float output of the block
    before (`QatEncoderBlock(residual=...)`): `(cls_state, None)` or `(None, sequence)`."""
    residual = None
    for block in blocks[:-1]:
        x, residual = block(x, padding_mask=padding_mask, residual=residual,
                            return_residual=True)  # (B, T, H) each
    if classify:
        return blocks[-1](x, padding_mask=padding_mask, query_length=1,
                          residual=residual)[:, 0, :], None  # (B, H)
    return None, blocks[-1](x, padding_mask=padding_mask, residual=residual)  # (B, T, H)


def _check_mappable(model, backbone):
    """Names the first layer of a float model that `from_float` cannot map."""
    for layer in model.layers:
        if layer is not backbone and layer.name not in _HEAD_LAYERS:
            raise ValueError(
                f"QatBert cannot map layer '{layer.name}' ({type(layer).__name__}) of "
                f"{model.name}: only a BertBackbone, `output_dropout`, `logits` and `crf` "
                "are known. Received: layer=" + layer.name
            )
    block_names = {f"transformer_layer_{i}" for i in range(backbone.num_layers)}
    for layer in backbone.layers:
        if layer.name in _BACKBONE_LAYERS:
            continue
        if layer.name not in block_names or getattr(layer, "norm_first", False):
            raise ValueError(
                f"QatBert cannot map layer '{layer.name}' ({type(layer).__name__}) of the "
                "backbone: it re-expresses post-LN BERT encoder blocks only. "
                f"Received: layer={layer.name}"
            )
    embeddings = backbone.get_layer("embeddings")
    if embeddings.position_encoding != "learned" or embeddings.scale_token_embeddings:
        raise ValueError(
            "QatBert needs BERT's learned position table without token scaling. Received: "
            f"position_encoding={embeddings.position_encoding!r}, "
            f"scale_token_embeddings={embeddings.scale_token_embeddings}"
        )


def _weight_pairs(qat, model):
    """(QAT variable, float variable or list of variables) for every weight.

    Derived from the backbone's canonical weight map (`bert_weight_targets`): each QAT
    variable is named after a role of `bert_block_weight_names` & co., whose canonical
    names lead to the float variable (or the unfused Q, K, V variables, in that order).
    """
    targets, _ = bert_weight_targets(model.backbone)
    float_variables = {name: variable for variable, names, _ in targets for name in names}
    pairs = []
    for variable, names in _qat_weight_names(qat):
        sources = []
        for name in names:
            if not any(float_variables[name] is source for source in sources):
                sources.append(float_variables[name])
        pairs.append((variable, sources[0] if len(sources) == 1 else sources))
    logits = model.get_layer("logits")
    pairs += [(qat.get_layer("logits").kernel, logits.kernel),
              (qat.get_layer("logits").bias, logits.bias)]
    if qat.use_crf:
        pairs += [(getattr(qat.crf, name), getattr(model.crf, name)) for name in _CRF_WEIGHTS]
    return pairs


def _qat_weight_names(qat):
    """(QAT variable, canonical names) of the backbone part of `qat`."""
    layers = [(qat.get_layer("embeddings"), BERT_EMBEDDING_WEIGHT_NAMES)]
    layers += [(block, bert_block_weight_names(i)) for i, block in enumerate(qat._blocks())]
    if qat.head == "classification":
        layers.append((qat.get_layer("pooled_dense"), BERT_POOLER_WEIGHT_NAMES))
    return [(getattr(layer, role), names)
            for layer, roles in layers for role, names in roles.items()]


def _to_qat_layout(target, value):
    """A float weight (or the unfused Q, K, V list) reshaped to the QAT variable's shape."""
    if isinstance(value, list):
        # Unfused (H, n, d) kernels / (n, d) biases: stack on a "3" axis like the fused one.
        parts = [ops.convert_to_numpy(v) for v in value]
        axis = 1 if parts[0].ndim == 3 else 0
        value = np.stack(parts, axis=axis)
    return np.reshape(ops.convert_to_numpy(value), tuple(target.shape))


def _float_shape(target):
    if isinstance(target, list):
        raise ValueError(
            "to_float writes into a fused-Q/K/V BertBackbone (fused_qkv=True); the target "
            "model has separate query/key/value projections. Received: fused_qkv=False"
        )
    return tuple(target.shape)
