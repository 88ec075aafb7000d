"""`ModelConfig`: the `get_config` / `from_config` of every keras-attn model.

Our models rebuild their whole graph in `__init__` from the constructor arguments, each
stored under its own name (`self.store_arguments(locals())` sets `self.num_layers` to
`num_layers`, and so on), so the config is those arguments and nothing else: the
constructor's signature declares it once.

    get_config()  = {name, trainable, dtype} + {argument: self.argument for each
                    named parameter of __init__}   (Keras objects serialized)
    from_config(c) = cls(**c)                      (serialized Keras objects and the
                                                    dtype policy deserialized)
"""

import inspect
import re
import warnings

import keras

# Layer arguments every model accepts through `**kwargs`, always stored.
_BASE_KEYS = ("name", "trainable", "dtype")


class ModelConfig:
    """Mixin giving a model whose `__init__` stores every named argument under the same
    attribute name a `get_config` / `from_config` pair that round-trips.

    Put it first among the bases: `class BertBackbone(ModelConfig, keras.Model)`, and end
    `__init__` with `self.store_arguments(locals())` (or assign each argument by hand).
    Arguments holding a Keras object (a backbone, a wrapped LM) are serialized with
    `keras.saving.serialize_keras_object` and rebuilt by `from_config`; the `dtype`
    given to the constructor (`"mixed_bfloat16"`) becomes the model's dtype policy and
    is stored as `dtype`.

    Example:
    >>> @keras.saving.register_keras_serializable(package="doctest")
    ... class Affine(ModelConfig, keras.Model):
    ...     def __init__(self, units, use_bias=True, **kwargs):
    ...         inputs = keras.Input((3,))
    ...         dense = keras.layers.Dense(units, use_bias=use_bias)
    ...         super().__init__(inputs=inputs, outputs=dense(inputs), **kwargs)
    ...         self.store_arguments(locals())
    >>> config = Affine(2, use_bias=False, name="affine").get_config()
    >>> sorted(config)
    ['dtype', 'name', 'trainable', 'units', 'use_bias']
    >>> Affine.from_config(config).get_config() == config
    True
    """

    def __init__(self, *args, dtype=None, **kwargs):
        # keras.Model's functional constructor drops `dtype`: set the policy the layers
        # were built with here, so that `get_config` records it.
        super().__init__(*args, **kwargs)
        if dtype is not None:
            self.dtype_policy = dtype

    @classmethod
    def config_arguments(cls):
        """The named parameters of `__init__` (not `self`, `*args`, `**kwargs` or the
        base keys `name`, `trainable`, `dtype`): the config's own entries."""
        parameters = inspect.signature(cls.__init__).parameters.values()
        return tuple(
            p.name for p in parameters
            if p.name != "self" and p.name not in _BASE_KEYS
            and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        )

    def store_arguments(self, arguments):
        """Stores every config argument under its own name: `self.<argument> = value`.

        Args:
            arguments: dict, the constructor's `locals()` (after `super().__init__`), holding
                each name of `config_arguments()`.
        """
        for argument in self.config_arguments():
            if argument not in arguments:
                raise KeyError(
                    f"{type(self).__name__}.store_arguments needs the value of `{argument}` "
                    f"(pass the constructor's locals()). Received: {sorted(arguments)}"
                )
            setattr(self, argument, arguments[argument])

    def get_config(self):
        config = {
            "name": self.name,
            "trainable": self.trainable,
            "dtype": keras.dtype_policies.serialize(self.dtype_policy),
        }
        for argument in self.config_arguments():
            if not hasattr(self, argument):
                raise AttributeError(
                    f"{type(self).__name__}.__init__ takes `{argument}` but does not "
                    f"store it as `self.{argument}`, which get_config reads. Received: "
                    f"attributes without {argument!r}"
                )
            value = getattr(self, argument)
            if isinstance(value, keras.layers.Layer):
                value = keras.saving.serialize_keras_object(value)
            config[argument] = value
        return config

    def quantize(self, mode=None, config=None, filters=None, **kwargs):
        """`keras.Model.quantize` without a warning per layer that has nothing to quantize.

        Keras calls `quantize` on every leaf layer and warns for each one that does not
        implement it (every `LayerNormalization`, `Dropout`, mask or position layer: dozens
        of warnings on BERT-base). Here only layers that implement it (`Dense`,
        `EinsumDense`, `Embedding` and their subclasses) are visited, with the given
        `filters` on top; an embedding whose table another layer reads as the output
        projection stays float; one warning names the layers whose weight matrices stay
        float.
        """
        user_filter = _name_filter(filters)
        tied = _tied_embeddings(self)
        super().quantize(
            mode, config=config,
            filters=lambda layer: _quantizable(layer) and id(layer) not in tied and (
                user_filter is None or user_filter(layer)),
            **kwargs,
        )
        kept = _float_matrix_owners(self, tied)
        if kept:
            warnings.warn(
                f"{type(self).__name__}.quantize({mode!r}) keeps the weight matrices of "
                f"{len(kept)} layer(s) in float (no Keras quantization for them, or an "
                f"embedding tied to the output): {', '.join(kept[:6])}"
                f"{', ...' if len(kept) > 6 else ''}",
                stacklevel=2,
            )

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if isinstance(config.get("dtype"), dict):
            config["dtype"] = keras.dtype_policies.deserialize(config["dtype"])
        for argument in cls.config_arguments():
            if _is_serialized_object(config.get(argument)):
                config[argument] = keras.saving.deserialize_keras_object(config[argument])
        return cls(**config)


def _quantizable(layer):
    """True for layers whose class implements `quantize` (Dense, EinsumDense, Embedding)."""
    return type(layer).quantize is not keras.layers.Layer.quantize


def _tied_embeddings(model):
    """Embeddings whose table another layer reads as a matrix (`TiedEmbeddingLogits`,
    `MaskedLMHead`): quantizing them would hand that layer int8 codes, so they stay float.
    (`keras.layers.ReversibleEmbedding` quantizes its own reverse projection.)"""
    tied = set()
    for layer in model._flatten_layers(include_self=False):
        if isinstance(layer, keras.Model):
            continue
        for sub in layer._flatten_layers(include_self=False, recursive=False):
            if isinstance(sub, keras.layers.Embedding) and not isinstance(
                    sub, keras.layers.ReversibleEmbedding):
                tied.add(id(sub))
    return tied


def _name_filter(filters):
    """Keras' `filters` of `Model.quantize` as a callable (regexes match `layer.name`)."""
    if filters is None or callable(filters):
        return filters
    patterns = [filters] if isinstance(filters, str) else list(filters)
    return lambda layer: any(re.search(pattern, layer.name) for pattern in patterns)


def _float_matrix_owners(model, skipped):
    """`name (Class)` of the layers left float that own a matrix (>= 2-D weight): layers
    in `skipped`, and layers without `quantize` holding one directly (a fused Q/K/V kernel,
    a position table, CRF transitions). Norm scales and biases are never quantized."""
    owners = []
    for layer in model._flatten_layers(include_self=False):
        if _quantizable(layer) and id(layer) not in skipped:
            continue
        inner = {id(w) for sub in layer._flatten_layers(include_self=False) for w in sub.weights}
        if any(id(w) not in inner and len(w.shape) >= 2 for w in layer.weights):
            owners.append(f"{layer.name} ({type(layer).__name__})")
    return owners


def _is_serialized_object(value):
    """True for the dict `keras.saving.serialize_keras_object` makes of a layer."""
    return isinstance(value, dict) and "class_name" in value and "config" in value
