"""Import a checkpoint of Google's original BERT (`bert_model.ckpt.*` + `bert_config.json`).

The checkpoint is a TF1 name-based checkpoint read with `tf.train.load_checkpoint`.
Its variable names (`bert/encoder/layer_0/attention/self/query/kernel`, ...) are the
canonical names of `keras_attn.checkpoints.bert_weights` under the `bert/` scope, with
kernels already in the `(in, out)` layout of Keras. Google's release also contains the
pretraining heads under `cls/` (`cls/predictions/...`, `cls/seq_relationship/...`); the
backbone has no place for them, so they must be excluded explicitly with
`skip=("cls/",)`.
"""

import logging

import tensorflow as tf

from keras_attn.checkpoints.bert_weights import assign_bert_weights
from keras_attn.checkpoints.bert_weights import bert_config_to_kwargs
from keras_attn.checkpoints.bert_weights import check_allow_missing
from keras_attn.checkpoints.bert_weights import strip_skipped
from keras_attn.checkpoints.checkpoint_files import read_json_config
from keras_attn.models.bert_backbone import BertBackbone

logger = logging.getLogger(__name__)

SCOPE = "bert/"
# Google's modeling.py computes "gelu" with the tanh approximation
# 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), so that is what its weights expect.
GOOGLE_ACTIVATIONS = {"gelu": "gelu_approximate", "relu": "relu"}
# modeling.py normalizes with tf.contrib.layers.layer_norm, whose epsilon is 1e-12.
GOOGLE_LAYER_NORM_EPSILON = 1e-12


def google_bert_config_to_kwargs(config, source="bert_config.json"):
    """`BertBackbone` arguments from Google's `bert_config.json` dict (validated)."""
    activation = config.get("hidden_act", "gelu")
    if activation not in GOOGLE_ACTIVATIONS:
        raise ValueError(
            f"{source}: `hidden_act` must be one of {sorted(GOOGLE_ACTIVATIONS)}. "
            f"Received: hidden_act={activation!r}"
        )
    return bert_config_to_kwargs(
        config, source=source, config_name="Google BertConfig",
        activation=GOOGLE_ACTIVATIONS[activation],
        layer_norm_epsilon=GOOGLE_LAYER_NORM_EPSILON,
    )


def load_google_bert(checkpoint_prefix, config_path, *, allow_missing=(), skip=(),
                     fused_qkv=True, dtype=None, dropout=None, activation=None):
    """A `BertBackbone` with the weights of an original Google BERT TF checkpoint.

    Nothing is skipped silently: every variable of the checkpoint must map to a weight
    of the backbone or match a prefix in `skip`. Google's checkpoints carry the
    pretraining heads under `cls/`, so the usual call is
    `load_google_bert(prefix, config, skip=("cls/",))`; fine-tuned checkpoints may add
    `output_weights`/`output_bias` (a classifier), `global_step` and Adam slots
    (`.../adam_m`, `.../adam_v`), which are reported the same way.

    Args:
        checkpoint_prefix: the checkpoint prefix, e.g. `.../bert_model.ckpt` (the path
            without `.index` / `.data-*`).
        config_path: path of `bert_config.json`.
        allow_missing: `("pooler",)` to accept a checkpoint without `bert/pooler/...`.
        skip: tuple of variable-name prefixes to leave out on purpose.
        fused_qkv: build the backbone with a fused Q/K/V kernel. Defaults to `True`.
        dtype: dtype policy of the backbone. Defaults to the global policy.
        dropout: overrides the config's dropout rate.
        activation: overrides the activation. By default `"gelu"` in the config becomes
            `"gelu_approximate"`, the tanh GELU of Google's modeling.py; pass `"gelu"`
            to get the exact (erf) GELU that transformers uses for the same weights.

    Returns:
        The `BertBackbone`.

    Raises:
        ValueError: unreadable files, an unsupported config, and missing, unused or
            mismatched variables (all listed).
    """
    allow_missing = check_allow_missing(allow_missing)
    config = read_json_config(config_path, argument="config_path")
    if dropout is not None:
        config = {**config, "hidden_dropout_prob": dropout,
                  "attention_probs_dropout_prob": dropout}
    kwargs = google_bert_config_to_kwargs(config, source=config_path)
    if activation is not None:
        kwargs["activation"] = activation
    try:
        reader = tf.train.load_checkpoint(checkpoint_prefix)
    except (tf.errors.NotFoundError, tf.errors.DataLossError, ValueError) as error:
        raise ValueError(
            f"Cannot read a TensorFlow checkpoint at {checkpoint_prefix!r} ({error}). Pass "
            "the prefix shared by the .index and .data-* files, e.g. "
            f".../bert_model.ckpt. Received: checkpoint_prefix={checkpoint_prefix!r}"
        ) from error

    names, skipped = strip_skipped(sorted(reader.get_variable_to_shape_map()), skip)
    canonical, unmapped = {}, []
    for name in names:
        if name.startswith(SCOPE):
            canonical[name[len(SCOPE):]] = reader.get_tensor(name)
        else:
            unmapped.append(name)

    backbone = BertBackbone(**kwargs, fused_qkv=fused_qkv, dtype=dtype)
    absent = assign_bert_weights(
        backbone, canonical, source=checkpoint_prefix,
        original_name=lambda key: SCOPE + key, stored_shape=lambda key, shape: shape,
        unmapped=unmapped, skip=skip, skip_example=("cls/",), allow_missing=allow_missing,
    )
    logger.info("Imported %d variables from %s; skipped %d by request (%s); kept initial "
                "values for %s", len(canonical), checkpoint_prefix, len(skipped), skip,
                absent)
    return backbone
