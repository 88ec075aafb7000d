"""`copy_quantized_weights`: a quantization-aware model's trained weights and activation
ranges carried onto another `quantize_model` copy of the same layers wired otherwise (a
language model's decoding step, whose graph reads a cache, from the full-sequence model that
quantization-aware training fitted).

`quantize_model` keeps the float model's layer names, and a model's decoding step
(`GPTCausalLM.decoder_step_model`) is built from the same named layers, so each layer of the
step's copy finds its trained counterpart by name: the same class holding weights of the same
shapes (the block's int8 layout, its quantizers' ranges and float channels included). A layer
only the step has (the cache input's quantizer) keeps what `calibrate_model` gave it.
"""


def named_layers(model):
    """`{name: layer}` of the weighted layers of `model`'s graph, nested models' layers
    included (a backbone inside a task model) and the nested models themselves left out; a
    name held by two layers is a `ValueError` (the copy would be ambiguous)."""
    layers = {}
    for layer in model.layers:
        if hasattr(layer, "layers") and hasattr(layer, "inputs") and layer.inputs:
            found = named_layers(layer)  # a nested functional model: its layers
        elif layer.weights:
            found = {layer.name: layer}
        else:
            continue  # inputs and weightless layers: nothing to copy
        for name, item in found.items():
            if name in layers:
                raise ValueError(f"two layers of {model.name} are named {name!r}: their "
                                 "weights cannot be matched by name")
            layers[name] = item
    return layers


def copy_quantized_weights(source, target):
    """Sets each weighted layer of `target` to the weights of the layer of `source` with its
    name.

    Args:
        source: a `quantize_model` copy, trained (quantization-aware) or calibrated.
        target: another `quantize_model` copy of the same layers (e.g. of the model's
            decoding step), calibrated for the layers only it has.

    Returns:
        The names of `target`'s weighted layers that `source` has not (left as they were).

    Raises:
        ValueError: a layer of both with another class or other weight shapes (the models
            are not copies of one float model in one layout).

    Example:
    >>> from keras_attn.quantization import quantize_model
    >>> inputs = keras.Input((4,))
    >>> model = keras.Model(inputs, keras.layers.Dense(2, name="head")(inputs))
    >>> a, b = quantize_model(model), quantize_model(model)
    >>> copy_quantized_weights(a, b)
    []
    """
    sources = named_layers(source)
    missing = []
    for name, layer in named_layers(target).items():
        if name not in sources:
            missing.append(name)
            continue
        found = sources[name]
        shapes = [tuple(w.shape) for w in found.weights]
        wanted = [tuple(w.shape) for w in layer.weights]
        if type(found) is not type(layer) or shapes != wanted:
            raise ValueError(
                f"layer {name!r}: {type(found).__name__} with weights {shapes} in "
                f"{source.name}, {type(layer).__name__} with {wanted} in {target.name}: not "
                "copies of one model in one layout")
        layer.set_weights(found.get_weights())
    return missing
