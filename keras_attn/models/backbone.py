"""`Backbone`: the base of keras-attn's functional models (presets, token embedding, blocks)."""

import keras

from keras_attn.models.model_arguments import preset_arguments
from keras_attn.models.model_config import ModelConfig


class Backbone(ModelConfig, keras.Model):
    """A functional model built from its constructor arguments, with named presets.

    What every keras-attn backbone (`BertBackbone`, `GPTBackbone`, `XLNetBackbone`,
    `TransformerXLLM`, `Seq2SeqTransformer`, `AttentionRNNSeq2Seq`) shares, written once:

    - `from_preset(name, **overrides)`: the class' `presets[name]` arguments, with
      `overrides` on top, and fresh weights; an unknown name raises a `ValueError`
      listing the known ones;
    - `token_embedding`: the `keras.layers.Embedding` of the token ids, the sublayer the
      class names in `token_embedding_path`;
    - `transformer_layers`: the Transformer blocks, first to last, the layers named
      `{prefix}{i}` for each of `transformer_layer_prefixes` and `i < num_layers`;
    - `get_config` / `from_config`: the constructor arguments (`ModelConfig`).

    A subclass builds its graph in `__init__`, calls `super().__init__(inputs=...,
    outputs=..., dtype=dtype, **kwargs)`, ends with `self.store_arguments(locals())` and
    sets the class attributes below.

    Class attributes:
        presets: dict, preset name -> constructor arguments (`BERT_PRESETS`, ...).
        preset_family: str, the model family the unknown-preset error names (`"BERT"`).
        token_embedding_path: str, the token embedding's layer name, then the attributes
            leading to it, dot-separated (`"embeddings.token_embedding"`).
        transformer_layer_prefixes: tuple of str, the names of the blocks without their
            index (`("encoder_layer_", "decoder_layer_")`); `()` for a model without
            Transformer blocks.

    Example:
    >>> @keras.saving.register_keras_serializable(package="doctest")
    ... class TinyBackbone(Backbone):
    ...     presets = {"tiny": dict(vocabulary_size=10, num_layers=2)}
    ...     preset_family = "Tiny"
    ...     transformer_layer_prefixes = ("layer_",)
    ...     def __init__(self, vocabulary_size, num_layers, dtype=None, **kwargs):
    ...         token_ids = keras.Input((None,), dtype="int32")
    ...         x = keras.layers.Embedding(vocabulary_size, 4, name="token_embedding")(token_ids)
    ...         for i in range(num_layers):
    ...             x = keras.layers.Dense(4, name=f"layer_{i}")(x)
    ...         super().__init__(inputs=token_ids, outputs=x, dtype=dtype, **kwargs)
    ...         self.store_arguments(locals())
    >>> model = TinyBackbone.from_preset("tiny", num_layers=3)
    >>> model.token_embedding.input_dim, [layer.name for layer in model.transformer_layers]
    (10, ['layer_0', 'layer_1', 'layer_2'])
    >>> TinyBackbone.from_preset("huge")
    Traceback (most recent call last):
    ...
    ValueError: Unknown Tiny preset. Choose one of ['tiny']. Received: name='huge'
    """

    presets = {}
    preset_family = None
    token_embedding_path = "token_embedding"
    transformer_layer_prefixes = ("transformer_layer_",)

    @classmethod
    def from_preset(cls, name, **overrides):
        """A model with the architecture of `cls.presets[name]` and fresh weights
        (`keras_attn.checkpoints` imports pretrained ones).

        Args:
            name: str, a key of `cls.presets`.
            **overrides: constructor arguments replacing the preset's (`dropout`,
                `vocabulary_size`, `dtype`, ...).

        Raises:
            ValueError: `name` is not a preset of this class.
        """
        arguments = preset_arguments(cls.presets, name, cls.preset_family or cls.__name__)
        return cls(**{**arguments, **overrides})

    @property
    def token_embedding(self):
        """The `keras.layers.Embedding` of the token ids (a `ReversibleEmbedding` where the
        output projection is tied to it)."""
        layer_name, *attributes = self.token_embedding_path.split(".")
        layer = self.get_layer(layer_name)
        for attribute in attributes:
            layer = getattr(layer, attribute)
        return layer

    @property
    def transformer_layers(self):
        """The Transformer blocks, first to last (encoder blocks before decoder blocks)."""
        return [layer for prefix in self.transformer_layer_prefixes
                for layer in self._numbered_layers(prefix)]

    def _numbered_layers(self, prefix):
        """The layers `{prefix}0` .. `{prefix}{num_layers - 1}`."""
        return [self.get_layer(f"{prefix}{i}") for i in range(self.num_layers)]
