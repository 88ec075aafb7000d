"""`EncoderInt8Layout`: the int8 layout of a Transformer block (post-LN as BERT's, pre-LN
and causal as GPT's, with cross-attention as the translation Transformer's decoder, over a
whole sequence or a decoding step with its caches, with XLNet's or Transformer-XL's relative
terms and memory), fake-quantized for quantization-aware training, rounding where its int8
TFLite file rounds. Mixed into `TransformerEncoderBlock`, `TransformerDecoderBlock`,
`XLNetBlock` and `TransformerXLBlock` (their `quantization` setting); each supplies its
weights through `_int8_weights()`."""

import math

from keras import ops

from keras_attn.layers.activation_quantizer import ActivationQuantizer
from keras_attn.layers.feedforward_float_channels import FeedforwardFloatChannels
from keras_attn.layers.int8_attention import Int8Attention
from keras_attn.layers.int8_layout_settings import CROSS_MATMULS
from keras_attn.layers.int8_layout_settings import MATMULS
from keras_attn.layers.int8_layout_settings import PRE_LN_CROSS_MATMULS
from keras_attn.layers.int8_layout_settings import PRE_LN_MATMULS
from keras_attn.layers.int8_layout_settings import QUANTIZER_NAMES
from keras_attn.layers.int8_layout_settings import RESIDUAL_QUANTIZER_NAMES
from keras_attn.layers.int8_layout_settings import SOFTMAX_RANGE
from keras_attn.layers.int8_layout_settings import check_feedforward_float_channels
from keras_attn.layers.int8_layout_settings import check_float_matmuls
from keras_attn.layers.quantized_dense import check_weight_quantization
from keras_attn.layers.quantized_dense import matmul_bound
from keras_attn.layers.quantized_dense import quantized_matmul
from keras_attn.layers.quantized_layer_normalization import layer_norm
from keras_attn.layers.quantized_layer_normalization import layer_norm_quantizers
from keras_attn.layers.validation import check_bool


class EncoderInt8Layout(Int8Attention, FeedforwardFloatChannels):
    """The int8 computation of a Transformer block (Vaswani et al., 2017, §3.1) with fake
    quantization (Jacob et al., 2018), post-LN (BERT's) or, with the host's `norm_first`,
    pre-LN (GPT-2's; the causal mask `M` with `causal=True`):

        post-LN: y = LN(x + Dropout(Attn(x))),  z = LN(y + Dropout(FFN(y)))
        pre-LN:  y = x + Dropout(Attn(LN(x))),  z = y + Dropout(FFN(LN(y)))
        Attn(x) = concat_h(softmax(Q_h K_h^T / sqrt(d) + M) V_h) W_O
        FFN(y) = W_2 act(W_1 y + b_1) + b_2

    Layout: 2-D matmuls `(B*T, H) x (H, out)`, Q, K and V by one fused `(H, 3H)` matmul
    and one split (`1/sqrt(d)` folded into the query columns inside the graph, so the
    stored weights are the float model's), heads by reshape `(B, T, n, d)` + transpose,
    and two batched matmuls per head group. Every matmul output, residual sum, LayerNorm
    output, GELU output and the softmax output is quantized once, where it is produced.

    Padding mask in int8: padded keys are set to the bottom of the score range, which
    `ActivationQuantizer(mask_margin=...)` places `attention_mask_margin` below the EMA
    minimum of the real scores. With `quantize=False` they get -1e9 (`masked_score`), as
    in the float model.

    `float_residual=True` leaves the residual sums and the LayerNorm internals in float
    (their quantizers only track ranges); the LayerNorm outputs are rounded to int8 only
    where a weight matmul reads them, and the residual sums and the float feed-forward
    channels read them in float. BERT-like models carry a few outlier dimensions in the
    residual stream (Bondarenko et al., 2021) that a per-tensor int8 range cannot hold
    together with the others. The attention is float too between the int8 Q, K, V and the
    int8 context: `Q K^T`, the mask, softmax and `P V` are not rounded (their quantizers
    only track ranges). This is, rounding point for rounding point, what the int8 TFLite
    file computes: ADD and LayerNorm in float between a DEQUANTIZE and a QUANTIZE, every
    weight matmul in int8, the attention products, softmax and GELU in float
    (`export.tflite_float_ops`), so the calibrated model predicts the file.

    Cross-attention (a `TransformerDecoderBlock` built with an encoder sequence `E`) is a
    third sublayer after the self-attention, `u = LN(y + CrossAttn(y, E))` (pre-LN:
    `u = y + CrossAttn(LN(y), E)`), in the same layout: the query `(H, H)`, the key/value
    `(E, 2H)` of the encoder output (rounded by the block's `encoder_quantizer`) and the
    output `(H, H)` are int8 matmuls, its residual sum and LayerNorm as the
    self-attention's. Decoding step by step, the self-attention cache `(B, 2, S_max, n, d)`
    takes this step's int8 keys and values at its index and the queries attend over the
    slots written so far; the cross cache holds the int8 keys and values of the encoder
    output. A step's outputs are the whole sequence's, exactly.

    `feedforward_float_channels=k` (with `float_residual`) runs the k widest hidden
    channels of the feed-forward network in float, the mixed-precision decomposition of
    LLM.int8() (Dettmers et al., 2022, §3.2) applied to the FFN's hidden channels:

        FFN(y) = W_2[:, I] act(W_1[I, :] y + b_1[I]) + b_2     (int8, F - k channels)
               + W_2[:, O] act(W_1[O, :] y + b_1[O])            (float, k channels)

    with `O` the k channels of widest calibrated range (`permute_feedforward_channels`
    stores them last). The two parts meet in the float residual sum; the function is the
    same for every k.

    Settings (`int8_layout_settings.LAYOUT_DEFAULTS`):
        weight_quantization: `"per_channel"` or `"per_tensor"`. quantize: bool, `False`
            runs the same graph in float. decay: EMA factor. attention_mask_margin: float,
            see above. masked_score: float, masked scores when `quantize=False`.
        float_residual: bool, see above. feedforward_float_channels: int in
            `[0, intermediate_dim)`, more than 0 needs `float_residual`.
        float_matmuls: names of `MATMULS` run in float, with the rounding of their input
            (where the block makes it) and output (what an int8 budget moves to float).
        quantize_output: bool, round the output to int8 (the next layer's first matmul
            reads it). Defaults to `quantize` (pre-LN with `float_residual`: `False`).
        quantize_input: bool, round the input to int8 in the block (`input_quantizer`):
            for an input that no int8 layer produced. Defaults to `False`.
        input_producer: optional path of the `ActivationQuantizer` whose int8 codes the
            input carries (`quantize_model` sets it): frozen ranges round the Q/K/V bias
            at its step, as the file stores it (see `QuantizedDense`).

    The host class sets `num_heads`, `intermediate_dim`, `layer_norm_epsilon`,
    `activation` (a callable), the dropout sublayers `attention_dropout_layer`,
    `attention_output_dropout_layer`, `feedforward_dropout_layer`, and defines
    `_int8_weights()` and `_channel_axes()` (the `(variable, axis)` pairs a feed-forward
    channel permutation moves). `_int8_weights()` returns `{name: tensor}`: `qkv_kernel`
    `(H, 3H)` (the Q, K, V columns, heads in order), `qkv_bias` `(3H,)`, `output_kernel`
    `(H, H)`, `output_bias`, `attention_gamma`, `attention_beta`, `intermediate_kernel`
    `(H, F)`, `intermediate_bias`, `feedforward_output_kernel` `(F, H)`,
    `feedforward_output_bias`, `feedforward_gamma`, `feedforward_beta`.
    """

    def _init_int8_layout(self, intermediate_dim, weight_quantization="per_channel",
                          quantize=True, decay=0.999, attention_mask_margin=12.0,
                          masked_score=-1e9, float_residual=False,
                          feedforward_float_channels=0, float_matmuls=(),
                          quantize_output=None, quantize_input=False, input_producer=None):
        check_weight_quantization(weight_quantization)
        check_bool("float_residual", float_residual)
        check_feedforward_float_channels(feedforward_float_channels, intermediate_dim,
                                         float_residual)
        float_matmuls = check_float_matmuls(float_matmuls)
        pre_ln = getattr(self, "norm_first", False)
        if quantize_output is None:
            # A pre-LN block's output is its residual sum: float in a float stream.
            quantize_output = quantize and not (pre_ln and float_residual)
        check_bool("quantize_output", quantize_output)
        check_bool("quantize_input", quantize_input)
        if pre_ln and (quantize_input or (quantize_output and float_residual)):
            raise ValueError(
                "A pre-LN block's input and output are its residual stream: no matmul reads "
                "its input (no `quantize_input`), and with `float_residual` its output stays "
                f"float (no `quantize_output`). Received: quantize_input={quantize_input}, "
                f"quantize_output={quantize_output}, float_residual={float_residual}")
        self.weight_quantization = weight_quantization
        self.quantize = quantize
        self.decay = decay
        self.attention_mask_margin = attention_mask_margin
        self.masked_score = masked_score
        self.float_residual = float_residual
        self.feedforward_float_channels = feedforward_float_channels
        self.float_matmuls = float_matmuls
        self.quantize_output = quantize_output
        self.quantize_input = quantize_input
        self.input_producer = input_producer
        residual_quantize = quantize and not float_residual
        self.quantizers = {name: ActivationQuantizer(decay=decay, name=name)
                           for name in QUANTIZER_NAMES}
        self.input_quantizer = (ActivationQuantizer(decay=decay, name="input_quantizer")
                                if quantize_input else None)
        # A `ChannelRanges` that eager calls update with the up-projection output (set
        # while calibrating, to find the widest channels).
        self.channel_statistics = None
        self.attention_layer_norm_quantizers = layer_norm_quantizers(
            "attention_layer_norm", decay, residual_quantize)
        self.feedforward_layer_norm_quantizers = layer_norm_quantizers(
            "feedforward_layer_norm", decay, residual_quantize)
        # With `float_residual` the int8 file computes Q K^T, the mask, softmax and P V in
        # float (`export.tflite_float_ops`): scores and probabilities are not rounded.
        attention_quantize = quantize and not float_residual
        self.score_quantizer = ActivationQuantizer(
            decay=decay, mask_margin=attention_mask_margin, masked_value=masked_score,
            quantize=attention_quantize, name="score_quantizer",
        )
        self.probability_quantizer = ActivationQuantizer(
            fixed_range=SOFTMAX_RANGE, quantize=attention_quantize,
            name="probability_quantizer"
        )
        self._set_quantize_flags()
        # The cross-attention sublayer's quantizers, added by `_build_int8_layout` to a
        # block built with an encoder sequence.
        self.cross_layer_norm_quantizers = {}
        self.cross_score_quantizer = self.cross_probability_quantizer = None
        self.frozen_bounds = None
        # Set when the ranges are frozen: the step of the int8 input (rounds the qkv bias).
        self.frozen_input_step = None

    def _set_quantize_flags(self):
        """Which quantizers round (the others only track ranges): the residual stream unless
        `float_residual`, the output as `quantize_output`, and no input or output of a
        matmul of `float_matmuls`."""
        matmuls = self._matmul_quantizers()
        float_quantizers = {name for matmul in self.float_matmuls if matmul in matmuls
                            for name in matmuls[matmul]}
        output = self._output_quantizer_name()
        for name, quantizer in self.quantizers.items():
            quantizer.quantize = (
                self.quantize_output if name == output
                else self.quantize and not self.float_residual
                if name in RESIDUAL_QUANTIZER_NAMES
                else self.quantize and name not in float_quantizers)
        if self.input_quantizer is not None:
            self.input_quantizer.quantize = self.quantize and "qkv" not in self.float_matmuls

    def get_config(self):
        config = super().get_config()
        if getattr(self, "quantization", None) is not None:  # the float blocks' setting
            config["quantization"] = self.int8_layout_config()
        return config

    def int8_layout_config(self):
        """The layout settings, as `_init_int8_layout` takes them."""
        return dict(
            weight_quantization=self.weight_quantization, quantize=self.quantize,
            decay=self.decay, attention_mask_margin=self.attention_mask_margin,
            masked_score=self.masked_score, float_residual=self.float_residual,
            feedforward_float_channels=self.feedforward_float_channels,
            float_matmuls=list(self.float_matmuls), quantize_output=self.quantize_output,
            quantize_input=self.quantize_input, input_producer=self.input_producer,
        )

    def _build_int8_layout(self):
        if self._has_cross_attention():
            self._add_cross_quantizers()
        elif set(self.float_matmuls) - set(MATMULS):
            raise ValueError(
                f"{self.name} has no cross-attention, so its matmuls are {tuple(MATMULS)}. "
                f"Received: float_matmuls={list(self.float_matmuls)!r}")
        if self.feedforward_float_channels:
            # Float channel j is stored at position i with order[i] = j
            # (`float_order_feedforward_weights` undoes the permutation).
            self.feedforward_channel_order = self.add_weight(
                name="feedforward_channel_order", shape=(self.intermediate_dim,),
                dtype="int32",
                initializer=lambda shape, dtype=None: ops.arange(shape[0], dtype="int32"),
                trainable=False, autocast=False,
            )
        for quantizer in self.int8_quantizers():
            quantizer.build(())

    def int8_quantizers(self):
        """Every `ActivationQuantizer` of the layout."""
        cross = ([self.cross_score_quantizer, self.cross_probability_quantizer]
                 if self.cross_score_quantizer is not None else [])
        return (list(self.quantizers.values())
                + list(self.attention_layer_norm_quantizers.values())
                + list(self.cross_layer_norm_quantizers.values())
                + list(self.feedforward_layer_norm_quantizers.values())
                + [self.score_quantizer, self.probability_quantizer] + cross
                + ([self.input_quantizer] if self.input_quantizer is not None else []))

    def _has_cross_attention(self):
        return getattr(self, "cross_attention", None) is not None

    def _matmul_quantizers(self):
        """The weight matmuls of this block and the quantizers of their int8 input and
        output: `MATMULS` (post-LN) or `PRE_LN_MATMULS` (`norm_first`), and their
        `CROSS_MATMULS` forms in a block with cross-attention."""
        pre_ln = getattr(self, "norm_first", False)
        if self._has_cross_attention():
            return PRE_LN_CROSS_MATMULS if pre_ln else CROSS_MATMULS
        return PRE_LN_MATMULS if pre_ln else MATMULS

    def int8_matmuls(self):
        """The names of this block's weight matmuls, in graph order (what `float_matmuls`
        takes)."""
        return tuple(self._matmul_quantizers())

    def _output_quantizer_name(self):
        """The quantizer of the block's output: the last LayerNorm's (post-LN) or the last
        residual sum's (pre-LN)."""
        return ("feedforward_residual_quantizer" if getattr(self, "norm_first", False)
                else "feedforward_layer_norm_quantizer")

    def output_quantizer(self):
        """The `ActivationQuantizer` of the block's output (rounding it unless float)."""
        return self.quantizers[self._output_quantizer_name()]

    def _check_int8_layout(self, d_model, key_dim):
        if key_dim * self.num_heads != d_model:
            raise ValueError(
                "The int8 layout (`quantization`) needs `key_dim * num_heads` equal to "
                f"the model width. Received: key_dim={key_dim}, num_heads="
                f"{self.num_heads}, d_model={d_model}")

    def _check_int8_call(self, attention_mask=None, attention_bias=None,
                         return_attention_scores=False, query_length=None, **others):
        """Raises for a call argument the int8 layout does not take (`others`: name ->
        whether it was given)."""
        given = [name for name, value in (
            ("attention_mask", attention_mask is not None),
            ("attention_bias", attention_bias is not None),
            ("return_attention_scores", return_attention_scores),
            ("query_length in a pre-LN block",
             query_length is not None and getattr(self, "norm_first", False)),
            *others.items()) if value]
        if given:
            raise ValueError(
                f"The int8 layout (`quantization`) of {type(self).__name__} takes a padding "
                f"mask and the causal mask only; it has no {', '.join(given)}. Use the "
                "float block (`quantization=None`) for them.")

    def _matmul(self, x, kernel, bias, name, own_input=True):
        """Matmul `name` of the layout; `own_input=False`: its input is not the one
        `_input_step(name)` names (its bias is then not rounded to the file's grid)."""
        bound = self.frozen_bounds[name] if self.frozen_bounds else None
        quantize = self.quantize and name not in self.float_matmuls
        return quantized_matmul(x, kernel, bias, quantize, self.weight_quantization,
                                bound, self._input_step(name) if own_input else None)

    def _input_step(self, name):
        """The frozen int8 step of matmul `name`'s input (`None` unless the ranges are
        frozen and the input int8): the block's input (`frozen_input_step`, or its own
        `input_quantizer`) or the block's own quantizer."""
        if not self.frozen_bounds:
            return None
        if name == "qkv" and not getattr(self, "norm_first", False):
            quantizer = self.input_quantizer  # the block's input
        else:
            quantizer = self.quantizers[self._matmul_quantizers()[name][0]]
        if quantizer is None:
            return self.frozen_input_step
        return quantizer.step() if quantizer.frozen_range and quantizer.quantize else None

    def freeze_weight_ranges(self, frozen=True):
        """Weight ranges as constants of the traced graph (export) or computed again."""
        if not frozen:
            self.frozen_bounds = None
            return
        w, wq = self._int8_weights(), self.weight_quantization
        scale = self._query_scale(w["qkv_kernel"].shape[0])
        channels = self._feedforward_parts()[0][0]
        self.frozen_bounds = {
            "qkv": matmul_bound(w["qkv_kernel"] * scale, wq),
            "attention_output": matmul_bound(w["output_kernel"], wq),
            "intermediate": matmul_bound(w["intermediate_kernel"][:, channels], wq),
            "feedforward_output": matmul_bound(w["feedforward_output_kernel"][channels], wq),
        }
        if self._has_cross_attention():
            cross_scale = 1.0 / math.sqrt(w["cross_query_kernel"].shape[1] // self.num_heads)
            self.frozen_bounds.update({
                "cross_query": matmul_bound(w["cross_query_kernel"] * cross_scale, wq),
                "cross_key_value": matmul_bound(w["cross_key_value_kernel"], wq),
                "cross_attention_output": matmul_bound(w["cross_output_kernel"], wq),
            })

    def _int8_call(self, inputs, padding_mask, training=None, query_length=None,
                   causal=False, cross=None, caches=None, score_terms=None, memory=None):
        """The block's output `(B, q, H)` (`q = T` without `query_length`: the first `q`
        query rows). `causal`: query `t` sees keys `s <= t` only. `cross`: the encoder
        output `(B, S, E)` (or `None` with a cross cache) and its padding mask `(B, S)` (or
        `None`) of a block with cross-attention. `caches` (incremental decoding): a dict of
        `"self"`, the `(B, 2, S_max, n, d)` key/value cache, `"index"`, where this call's
        `T` rows are written, and `"cross"`, the `(B, 2, S, n, d)` cross cache or `None`;
        the call writes the updated caches into it. `padding_mask` may be `(B, T, T)`, the
        keys each query sees. `score_terms`: the scores' extra terms, see
        `Int8Attention._attend`. `memory` (Transformer-XL): `(B, M, H)` rows before the
        segment, keys and values only (see `Int8Attention._int8_attention`; pre-LN, they
        go through the LayerNorm first); `padding_mask` is then `(B, M + T)`."""
        if getattr(self, "norm_first", False):
            return self._pre_ln_call(inputs, padding_mask, training, causal, cross, caches,
                                     score_terms, memory)
        q, w = self.quantizers, self._int8_weights()
        H = inputs.shape[-1]
        batch, length = ops.shape(inputs)[0], ops.shape(inputs)[1]
        # What the first residual sum reads: the input (float when the block rounds it).
        residual = inputs  # (B, T, H)
        if self.input_quantizer is not None:
            inputs = self.input_quantizer(inputs, training=training)
        x = ops.reshape(inputs, (-1, H))  # (B*T, H), what the weight matmuls read
        rows = length if query_length is None else query_length  # q, the query rows
        if query_length is not None:
            residual = residual[:, :query_length]  # (B, q, H)
        residual_rows = x if residual is inputs else ops.reshape(residual, (-1, H))

        # === Self-attention ===
        attended = self._int8_attention(x, w, batch, length, padding_mask, training,
                                        query_length, causal, caches, score_terms,
                                        memory)  # (B*q, H)
        x = q["attention_residual_quantizer"](residual_rows + attended, training=training)
        x = layer_norm(x, w["attention_gamma"], w["attention_beta"], self.layer_norm_epsilon,
                       self.attention_layer_norm_quantizers, training)  # (B*q, H)
        x_int8 = q["attention_layer_norm_quantizer"](x, training=training)  # (B*q, H)
        x = x if self.float_residual else x_int8  # what the residual and float parts read

        # === Cross-attention (encoder-decoder blocks) ===
        if cross is not None:
            attended = self._int8_cross_attention(x_int8, w, batch, rows, cross, training,
                                                  caches)
            x = q["cross_residual_quantizer"](x + attended, training=training)  # (B*q, H)
            x = layer_norm(x, w["cross_gamma"], w["cross_beta"], self.layer_norm_epsilon,
                           self.cross_layer_norm_quantizers, training)
            x_int8 = q["cross_layer_norm_quantizer"](x, training=training)  # (B*q, H)
            x = x if self.float_residual else x_int8

        # === Feed-forward: the int8 channels, then the float ones ===
        x = q["feedforward_residual_quantizer"](
            x + self._int8_feedforward(x_int8, x, w, training), training=training)
        x = layer_norm(x, w["feedforward_gamma"], w["feedforward_beta"],
                       self.layer_norm_epsilon, self.feedforward_layer_norm_quantizers,
                       training)
        x_int8 = q["feedforward_layer_norm_quantizer"](x, training=training)
        return ops.reshape(x_int8, (batch, rows, H))  # (B, q, H); q = T by default

    def _pre_ln_call(self, inputs, padding_mask, training, causal, cross=None, caches=None,
                     score_terms=None, memory=None):
        """The pre-LN block (`norm_first`): `y = x + Attn(LN(x))`, `z = y + FFN(LN(y))`; the
        LayerNorm outputs are what the matmuls read, int8; the residual stream is int8, or
        float with `float_residual`. A `memory` goes through the same LayerNorm and its
        quantizer: `LN(m)` and `LN(x)` have one int8 scale."""
        q, w = self.quantizers, self._int8_weights()
        H = inputs.shape[-1]
        batch, length = ops.shape(inputs)[0], ops.shape(inputs)[1]
        x = ops.reshape(inputs, (-1, H))  # (B*T, H), the residual stream

        def normed(rows):  # (N, H) -> LN(rows), int8
            h = layer_norm(rows, w["attention_gamma"], w["attention_beta"],
                           self.layer_norm_epsilon, self.attention_layer_norm_quantizers,
                           training)
            return q["attention_layer_norm_quantizer"](h, training=training)

        # === Self-attention on LN(x), LN(memory) keys and values only ===
        h = normed(x)  # (B*T, H), int8
        if memory is not None:
            memory = ops.reshape(normed(ops.reshape(memory, (-1, H))), ops.shape(memory))
        attended = self._int8_attention(h, w, batch, length, padding_mask, training,
                                        causal=causal, caches=caches,
                                        score_terms=score_terms, memory=memory)
        x = q["attention_residual_quantizer"](x + attended, training=training)  # (B*T, H)

        # === Cross-attention on LN(y) (encoder-decoder blocks) ===
        if cross is not None:
            h = layer_norm(x, w["cross_gamma"], w["cross_beta"], self.layer_norm_epsilon,
                           self.cross_layer_norm_quantizers, training)
            h = q["cross_layer_norm_quantizer"](h, training=training)  # (B*T, H), int8
            attended = self._int8_cross_attention(h, w, batch, length, cross, training,
                                                  caches)
            x = q["cross_residual_quantizer"](x + attended, training=training)  # (B*T, H)

        # === Feed-forward on LN(y) ===
        h = layer_norm(x, w["feedforward_gamma"], w["feedforward_beta"],
                       self.layer_norm_epsilon, self.feedforward_layer_norm_quantizers,
                       training)
        h_int8 = q["feedforward_layer_norm_quantizer"](h, training=training)
        h = h if self.float_residual else h_int8  # what the float channels read
        x = q["feedforward_residual_quantizer"](
            x + self._int8_feedforward(h_int8, h, w, training), training=training)
        return ops.reshape(x, (batch, length, H))  # (B, T, H)
