import keras
import numpy as np
from keras import ops

from keras_attn.layers.validation import check_int
from keras_attn.layers.validation import check_positive_int
from keras_attn.models.gpt_causal_lm import GPTCausalLM
from keras_attn.models.model_config import ModelConfig

FUTURE_TARGET_WEIGHT = 0.5


def intermediate_loss_weights(progress, num_layers):
    """Weights of the `L - 1` intermediate-layer losses at `progress` (share of training
    done, in [0, 1]): layer `l` (1-based) counts while `progress < l / (2L)`, then stops
    (Al-Rfou et al., 2018, §3.2), so the lowest layers fade out first and all are gone
    by half of training.

    Example:
    >>> intermediate_loss_weights(0.2, num_layers=4).tolist()
    [0.0, 1.0, 1.0]
    """
    layers = np.arange(1, num_layers, dtype="float32")
    return (np.float32(progress) < layers / (2.0 * num_layers)).astype("float32")


@keras.saving.register_keras_serializable(package="keras_attn")
class AuxiliaryLossLM(ModelConfig, keras.Model):
    """Training wrapper adding the auxiliary losses of Al-Rfou et al. (2018),
    "Character-Level Language Modeling with Deeper Self-Attention", §3.2, to a
    `GPTCausalLM`:

        L = sum_t CE(p_L(x_{t+1} | x_<=t))                              final layer, every t
          + sum_{l<L} a_l(s) sum_t CE(q_l(x_{t+1} | h_l,t))              intermediate layers
          + 0.5 sum_{k=1..K} sum_t CE(r_k(x_{t+1+k} | h_L,t))            multiple targets
        a_l(s) = 1 if s / S < l / (2L) else 0                          (the fade-out)

    `q_l` is a classifier of its own on block `l`'s output (`LayerNorm` + `Dense`,
    `layer_head_{l}`), `r_k` a classifier of its own on the final (normed) states
    predicting the character `k` steps after the next one (`future_head_{k}`); `s` is
    the optimizer's update count and `S = total_updates`. Each sum over positions is
    weighted by `sample_weight` (the trainer's per-token weights, which sum to 1 over
    a global batch); a future target is dropped where it lies past the text (id 0).

    The heads exist only here: `lm` is the plain language model to save and export.

    Args:
        lm: a `GPTCausalLM`.
        intermediate_layer_losses: bool, add the `L - 1` intermediate losses.
        future_targets: int >= 0, `K` extra future characters predicted per position.
        total_updates: int > 0, `S` above.
        **kwargs: `keras.Model` arguments.

    Inputs:
        The `lm`'s dict (`token_ids`, `padding_mask`).

    Returns:
        A dict: `logits` `(B, T, V)`, `layer_logits` (a list of `L - 1` (or 0) such
        tensors, first layer first) and `future_logits` (a list of `K`).

    Example:
    >>> from keras_attn.models.gpt_backbone import GPTBackbone
    >>> lm = GPTCausalLM(GPTBackbone(vocabulary_size=12, num_layers=2, num_heads=2,
    ...                              hidden_dim=8, intermediate_dim=16,
    ...                              max_sequence_length=8))
    >>> model = AuxiliaryLossLM(lm, intermediate_layer_losses=True, future_targets=1,
    ...                         total_updates=10)
    >>> out = model({"token_ids": np.ones((1, 4), "int32"),
    ...              "padding_mask": np.ones((1, 4), "int32")})
    >>> len(out["layer_logits"]), len(out["future_logits"])
    (1, 1)
    """

    def __init__(self, lm, intermediate_layer_losses=False, future_targets=0,
                 total_updates=1, **kwargs):
        if not isinstance(lm, GPTCausalLM):
            raise ValueError(f"`lm` must be a GPTCausalLM. Received: lm={lm!r}")
        check_int("future_targets", future_targets, low=0,
                  meaning="extra characters predicted per position")
        check_positive_int("total_updates", total_updates)
        super().__init__(**kwargs)
        backbone = lm.backbone
        self.lm = lm
        self.intermediate_layer_losses = bool(intermediate_layer_losses)
        self.future_targets = future_targets
        self.total_updates = total_updates
        num_layers = backbone.num_layers
        hidden = [backbone.get_layer(f"transformer_layer_{i}").output
                  for i in range(num_layers - 1)] if self.intermediate_layer_losses else []
        self.features = keras.Model(backbone.input, hidden + [backbone.output],
                                    name="features")
        dtype = backbone.dtype_policy
        vocabulary_size = backbone.vocabulary_size
        self.layer_heads = [
            keras.Sequential([
                keras.layers.LayerNormalization(epsilon=backbone.layer_norm_epsilon,
                                                dtype=dtype),
                keras.layers.Dense(vocabulary_size, dtype=dtype),
            ], name=f"layer_head_{i + 1}")
            for i in range(len(hidden))
        ]
        self.future_heads = [keras.layers.Dense(vocabulary_size, dtype=dtype,
                                                name=f"future_head_{k + 1}")
                             for k in range(future_targets)]
        # Built now (the heads' sizes are known), so the optimizer sees every weight.
        self({"token_ids": np.ones((1, 1), "int32"), "padding_mask": np.ones((1, 1), "int32")})

    def call(self, inputs, training=False):
        features = self.features(inputs, training=training)
        features = features if isinstance(features, (list, tuple)) else [features]
        final = features[-1]  # (B, T, H), after the final LayerNorm
        return {
            "logits": self.lm.get_layer("lm_head")(final),  # (B, T, V)
            "layer_logits": [head(h) for head, h in zip(self.layer_heads, features[:-1])],
            "future_logits": [head(final) for head in self.future_heads],
        }

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        """`L` of the class docstring. `y`: `(B, T, 1 + K)` ids (`[..., 0]` the next
        character, `[..., k]` the one `k` later, 0 past the text) or `(B, T)` when `K = 0`;
        `sample_weight`: `(B, T)` weights of the positions (default: the mean)."""
        y = ops.cast(y, "int32")
        y = y[..., None] if len(y.shape) == 2 else y  # (B, T, 1 + K)
        if sample_weight is None:
            sample_weight = ops.ones(ops.shape(y)[:2]) / ops.cast(
                ops.shape(y)[0] * ops.shape(y)[1], "float32")
        weights = ops.cast(sample_weight, "float32")  # (B, T)

        def weighted_ce(logits, targets, mask=None):
            ce = keras.losses.sparse_categorical_crossentropy(
                targets, ops.cast(logits, "float32"), from_logits=True)  # (B, T)
            w = weights if mask is None else weights * ops.cast(mask, "float32")
            return ops.sum(ce * w)

        total = weighted_ce(y_pred["logits"], y[..., 0])
        if y_pred["layer_logits"]:
            progress = ops.cast(self.optimizer.iterations, "float32") / self.total_updates \
                if self.optimizer is not None else 0.0
            layers = ops.arange(1, len(y_pred["layer_logits"]) + 1, dtype="float32")
            active = ops.cast(progress < layers / (2.0 * self.lm.backbone.num_layers),
                              "float32")  # (L - 1,), a_l(s)
            for i, logits in enumerate(y_pred["layer_logits"]):
                total = total + active[i] * weighted_ce(logits, y[..., 0])
        for k, logits in enumerate(y_pred["future_logits"]):
            target = y[..., k + 1]
            total = total + FUTURE_TARGET_WEIGHT * weighted_ce(logits, target, target != 0)
        for loss in self.losses:
            total = total + ops.cast(loss, "float32")
        return total
