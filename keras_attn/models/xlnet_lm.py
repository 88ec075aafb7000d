import keras
from keras import ops

from keras_attn.models.task_model import TaskModel
from keras_attn.models.xlnet_backbone import XLNetBackbone


@keras.saving.register_keras_serializable(package="keras_attn")
class XLNetLM(TaskModel):
    """XLNet permutation language model (Yang et al., 2019, §2.2–2.3).

        logits_p = g^L_p W_emb^T + b          (B, P, V)

    The query stream of a two-stream `XLNetBackbone` predicts the tokens named by the
    rows of `target_mapping` (partial prediction: the last `1/K` of each factorization
    order, see `permutation_lm_inputs`); the output matrix is the token embedding
    (tied), plus a bias `b` (`lm_bias`). Train with
    `SparseCategoricalCrossentropy(from_logits=True)` on the `(B, P)` target ids, with a
    sample weight that is 0 for padded targets.

    Args:
        backbone: an `XLNetBackbone` with `two_stream=True`.
        **kwargs: `keras.Model` arguments.

    Inputs:
        The backbone's dict (`token_ids`, `segment_ids`, `padding_mask`,
        `permutation_mask`, `target_mapping` and, with memory, `memory`).

    Returns:
        `(B, P, V)` logits, or a dict `{"logits", "memory"}` for a backbone with memory.

    Example:
    >>> from keras_attn.models.permutation_lm_inputs import permutation_lm_inputs
    >>> backbone = XLNetBackbone.from_preset("xlnet_tiny", vocabulary_size=20,
    ...                                      two_stream=True)
    >>> lm = XLNetLM(backbone)
    >>> inputs, labels, weights = permutation_lm_inputs(np.array([[3, 4, 5, 6]]),
    ...                                                 num_predict=2, seed=1)
    >>> tuple(lm(inputs).shape)
    (1, 2, 20)
    >>> XLNetLM.from_preset("xlnet_tiny", vocabulary_size=20).backbone.two_stream
    True
    """

    backbone_class = XLNetBackbone
    backbone_preset_arguments = {"two_stream": True}

    def __init__(self, backbone, **kwargs):
        if not isinstance(backbone, XLNetBackbone) or not backbone.two_stream:
            raise ValueError(
                "XLNetLM predicts from the query stream: it needs an XLNetBackbone built "
                "with `two_stream=True`. Received: backbone="
                f"{type(backbone).__name__}(two_stream={getattr(backbone, 'two_stream', None)})"
            )
        # === Layers ===
        bias = _OutputBias(backbone.vocabulary_size, dtype=backbone.dtype_policy,
                           name="lm_bias")

        # === Functional Model ===
        inputs = backbone.input
        outputs = backbone(inputs)
        query = outputs["query_output"]  # (B, P, d)
        logits = bias(backbone.token_embedding(query, reverse=True))  # (B, P, V)
        if backbone.memory_length is not None:
            logits = {"logits": logits, "memory": outputs["memory"]}
        super().__init__(inputs=inputs, outputs=logits, **kwargs)

        # === Config ===
        self.backbone = backbone


class _OutputBias(keras.layers.Layer):
    """Adds a learned `(V,)` bias to logits. Rebuilt by `XLNetLM.__init__`."""

    def __init__(self, units, **kwargs):
        super().__init__(**kwargs)
        self.units = units

    def build(self, input_shape):
        self.bias = self.add_weight(name="bias", shape=(self.units,), initializer="zeros")

    def call(self, x):
        return x + ops.cast(self.bias, x.dtype)

    def get_config(self):
        return {**super().get_config(), "units": self.units}
