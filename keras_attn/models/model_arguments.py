"""Argument handling shared by the model classes: the preset lookup of `from_preset` and
the checks of the sizes every Transformer stack takes.

Messages follow `keras_attn.layers.validation`: they name the argument, say what it must
be and end in "Received: name=value".
"""

from keras_attn.layers.validation import check_positive_int


def preset_arguments(presets, name, model_name):
    """The constructor arguments of the preset `name` (a copy of `presets[name]`).

    Args:
        presets: dict, preset name -> constructor arguments.
        name: str, the requested preset.
        model_name: str, named in the error (`"BERT"`, `"Seq2SeqTransformer"`).

    Raises:
        ValueError: `name` is not a key of `presets`.

    Example:
    >>> preset_arguments({"tiny": {"num_layers": 2}}, "tiny", "Toy")
    {'num_layers': 2}
    >>> preset_arguments({"tiny": {"num_layers": 2}}, "huge", "Toy")
    Traceback (most recent call last):
    ...
    ValueError: Unknown Toy preset. Choose one of ['tiny']. Received: name='huge'
    """
    if name not in presets:
        raise ValueError(
            f"Unknown {model_name} preset. Choose one of {sorted(presets)}. "
            f"Received: name={name!r}"
        )
    return dict(presets[name])


def check_transformer_sizes(vocabulary_size, num_layers, num_heads, hidden_dim,
                            intermediate_dim, key_dim=None, sinusoids=None):
    """Raises unless the sizes are positive ints and `num_heads` divides `hidden_dim`.

    Args:
        vocabulary_size, num_layers, num_heads, hidden_dim, intermediate_dim: the sizes.
        key_dim: optional positive int, a head size of its own: `num_heads` need not divide
            `hidden_dim` then.
        sinusoids: optional str, the sinusoidal encoding that pairs sine and cosine features
            of `hidden_dim` (`"the relative sinusoids"`): `hidden_dim` must then be even.

    Example:
    >>> check_transformer_sizes(100, 2, 3, 16, 32)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: `hidden_dim` must be divisible by `num_heads` ... hidden_dim=16, num_heads=3
    >>> check_transformer_sizes(100, 2, 3, 15, 32, key_dim=8,
    ...                         sinusoids="the sinusoids")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: `hidden_dim` must be even: the sinusoids pair sine ... Received: hidden_dim=15
    """
    check_positive_int("vocabulary_size", vocabulary_size)
    check_positive_int("num_layers", num_layers)
    check_positive_int("num_heads", num_heads)
    check_positive_int("hidden_dim", hidden_dim)
    check_positive_int("intermediate_dim", intermediate_dim)
    if key_dim is not None:
        check_positive_int("key_dim", key_dim)
    elif hidden_dim % num_heads:
        raise ValueError(
            "`hidden_dim` must be divisible by `num_heads` (each head gets "
            f"hidden_dim // num_heads features). Received: hidden_dim={hidden_dim}, "
            f"num_heads={num_heads}"
        )
    if sinusoids is not None and hidden_dim % 2:
        raise ValueError(
            f"`hidden_dim` must be even: {sinusoids} pair sine and cosine features. "
            f"Received: hidden_dim={hidden_dim}"
        )
