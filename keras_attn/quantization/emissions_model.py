"""`emissions_model`: the network an int8 (or float) file of a model holds, a CRF tagger's
emissions without the CRF that decodes them outside the file."""

import keras

from keras_attn.quantization.quantize_model import DECODED_OUTSIDE


def emissions_model(model):
    """The network an int8 (or float) file of `model` holds: `model` itself, or for a model
    with a CRF (a dict output whose `logits` are the CRF's emissions, as
    `BertTokenClassifier(use_crf=True)` returns) a model from the inputs the emissions read
    (not `label_mask`, which only the decoding reads) to the `logits`, same layers and
    weights; the tags are decoded outside the file (Viterbi with the CRF's transitions)."""
    if not any(isinstance(layer, DECODED_OUTSIDE)
               for layer in model._flatten_layers(include_self=False)):
        return model
    if not isinstance(model.output, dict) or "logits" not in model.output:
        raise ValueError("A model with a CRF must return a dict with the CRF's emissions as "
                         f"`logits` (as BertTokenClassifier(use_crf=True) does). Received "
                         f"outputs: {model.output}")
    inputs = dict(model.input) if isinstance(model.input, dict) else {
        tensor.name: tensor for tensor in model.inputs}
    for name in list(inputs):  # drop each input the emissions do not read
        try:
            keras.Model({k: v for k, v in inputs.items() if k != name},
                        model.output["logits"])
        except ValueError:
            continue
        del inputs[name]
    return keras.Model(inputs, model.output["logits"], name=f"{model.name}_emissions")
