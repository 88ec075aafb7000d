"""Import a Hugging Face BERT-family checkpoint (`config.json` + `model.safetensors`).

The safetensors file is read with `safetensors.numpy` — no PyTorch. Linear weights are
stored `(out, in)` by PyTorch and transposed into the `(in, out)` layout of Keras;
Q, K and V are concatenated into the backbone's fused kernel when it has one.
"""

import logging
import os
import re

import numpy as np

from keras_attn.checkpoints.bert_weights import assign_bert_weights
from keras_attn.checkpoints.bert_weights import bert_config_to_kwargs
from keras_attn.checkpoints.bert_weights import check_allow_missing
from keras_attn.checkpoints.bert_weights import strip_skipped
from keras_attn.checkpoints.checkpoint_files import HF_ACTIVATIONS
from keras_attn.checkpoints.checkpoint_files import read_hf_config
from keras_attn.checkpoints.checkpoint_files import read_safetensors
from keras_attn.models.bert_backbone import BertBackbone

logger = logging.getLogger(__name__)

# A PyTorch buffer, not a weight: position ids 0..P-1. Checked, then not imported.
POSITION_IDS_BUFFER = "embeddings.position_ids"

_LINEAR = re.compile(
    r"encoder\.layer\.(\d+)\."
    r"(attention\.self\.query|attention\.self\.key|attention\.self\.value"
    r"|attention\.output\.dense|intermediate\.dense|output\.dense)\.(weight|bias)"
)
_BLOCK_NORM = re.compile(
    r"encoder\.layer\.(\d+)\.(attention\.output|output)\.LayerNorm\.(weight|bias|gamma|beta)"
)
_EMBEDDING = re.compile(
    r"embeddings\.(word_embeddings|position_embeddings|token_type_embeddings)\.weight"
)
_EMBEDDING_NORM = re.compile(r"embeddings\.LayerNorm\.(weight|bias|gamma|beta)")
_POOLER = re.compile(r"pooler\.dense\.(weight|bias)")
_NORM_PARAMETER = {"weight": "gamma", "gamma": "gamma", "bias": "beta", "beta": "beta"}


def hf_bert_config_to_kwargs(config, source="config.json"):
    """`BertBackbone` arguments from a transformers `BertConfig` dict (validated).

    Raises:
        ValueError: for a config that is not a plain BERT encoder (another
            `model_type`, relative position embeddings, a decoder, an unknown activation,
            different hidden and attention dropouts) or lacks a size field.
    """
    def fail(what, key):
        return ValueError(
            f"{source}: {what}. BertBackbone is an absolute-position BERT encoder. "
            f"Received: {key}={config.get(key)!r}"
        )

    if config.get("model_type") != "bert":
        raise fail("only `model_type` 'bert' checkpoints can be imported", "model_type")
    if config.get("position_embedding_type", "absolute") != "absolute":
        raise fail("relative position embeddings are not supported",
                   "position_embedding_type")
    if config.get("is_decoder") or config.get("add_cross_attention"):
        raise fail("decoder checkpoints (causal or cross-attention) are not supported",
                   "is_decoder")
    if config.get("hidden_act") not in HF_ACTIVATIONS:
        raise fail(f"`hidden_act` must be one of {sorted(HF_ACTIVATIONS)}", "hidden_act")
    return bert_config_to_kwargs(
        config, source=source, config_name="BertConfig",
        activation=HF_ACTIVATIONS[config["hidden_act"]],
        layer_norm_epsilon=config.get("layer_norm_eps", 1e-12),
    )


def hf_name_to_canonical(name):
    """The canonical name of an HF BertModel tensor (without `bert.`), or `None`.

    Example:
    >>> hf_name_to_canonical("encoder.layer.3.attention.self.query.weight")
    'encoder/layer_3/attention/self/query/kernel'
    >>> hf_name_to_canonical("cls.predictions.bias") is None
    True
    """
    if m := _EMBEDDING.fullmatch(name):
        return f"embeddings/{m[1]}"
    if m := _EMBEDDING_NORM.fullmatch(name):
        return f"embeddings/LayerNorm/{_NORM_PARAMETER[m[1]]}"
    if m := _LINEAR.fullmatch(name):
        kind = "kernel" if m[3] == "weight" else "bias"
        return f"encoder/layer_{m[1]}/{m[2].replace('.', '/')}/{kind}"
    if m := _BLOCK_NORM.fullmatch(name):
        return (f"encoder/layer_{m[1]}/{m[2].replace('.', '/')}/LayerNorm/"
                f"{_NORM_PARAMETER[m[3]]}")
    if m := _POOLER.fullmatch(name):
        return f"pooler/dense/{'kernel' if m[1] == 'weight' else 'bias'}"
    return None


def load_hf_bert(directory, *, allow_missing=(), skip=(), fused_qkv=True, dtype=None,
                 dropout=None, activation=None):
    """A `BertBackbone` with the weights of a Hugging Face BERT checkpoint directory.

    Reads `config.json` (architecture: sizes, `hidden_act`, `layer_norm_eps`, ...),
    `model.safetensors` (weights, via `safetensors.numpy`; sharded files too) and checks
    `vocab.txt`, when present, against `vocab_size`. Tensors of `BertModel` and of the
    task models (`BertForMaskedLM`, ..., whose encoder sits under `bert.`) are accepted.

    Nothing is skipped silently: tensors the backbone has no place for (for example
    `cls.*` pretraining heads or `classifier.*`) raise a `ValueError` listing them unless
    their prefix is in `skip`; missing tensors and wrong shapes raise one too. The
    `embeddings.position_ids` buffer of PyTorch is checked to hold `0..P-1` and not
    imported (it is not a weight).

    Args:
        directory: path of the checkpoint directory.
        allow_missing: `("pooler",)` to accept a checkpoint saved without its pooler
            (`pooled_output` then comes from an untrained pooler). Defaults to `()`.
        skip: tuple of name prefixes (as in the file, e.g. `("cls.",)`) to leave out on
            purpose. Defaults to `()`.
        fused_qkv: build the backbone with a fused Q/K/V kernel (the three HF matrices are
            concatenated into it). Defaults to `True`.
        dtype: dtype policy of the backbone. Defaults to the global policy.
        dropout: overrides the config's dropout rate (needed when its hidden and
            attention dropouts differ).
        activation: overrides the activation derived from `hidden_act`.

    Returns:
        The `BertBackbone`, in inference mode by default like any Keras model.

    Raises:
        ValueError: unreadable or unsupported config, missing files, and missing, unused
            or mismatched tensors (all listed).
    """
    allow_missing = check_allow_missing(allow_missing)
    config, config_path = read_hf_config(
        directory, expected_files=("config.json", "model.safetensors", "vocab.txt"))
    if dropout is not None:
        config = {**config, "hidden_dropout_prob": dropout,
                  "attention_probs_dropout_prob": dropout}
    kwargs = hf_bert_config_to_kwargs(config, source=config_path)
    if activation is not None:
        kwargs["activation"] = activation
    _check_vocabulary(directory, kwargs["vocabulary_size"])

    tensors = read_safetensors(directory)
    names, skipped = strip_skipped(sorted(tensors), skip)
    prefix = "bert." if "bert.embeddings.word_embeddings.weight" in tensors else ""
    canonical, original, unmapped = {}, {}, []
    for name in names:
        local = name[len(prefix):] if prefix and name.startswith(prefix) else None
        local = name if not prefix else local
        if local == POSITION_IDS_BUFFER:
            _check_position_ids(tensors[name], kwargs["max_sequence_length"], name)
            continue
        key = None if local is None else hf_name_to_canonical(local)
        if key is None:
            unmapped.append(name)
            continue
        array = tensors[name]
        canonical[key] = array.T if key.endswith("/kernel") and array.ndim == 2 else array
        original[key] = name

    def original_name(key):
        if key in original:
            return original[key]
        return prefix + canonical_to_hf_name(key)

    def stored_shape(key, shape):
        return tuple(reversed(shape)) if key.endswith("/kernel") else shape

    backbone = BertBackbone(**kwargs, fused_qkv=fused_qkv, dtype=dtype)
    absent = assign_bert_weights(
        backbone, canonical, source=directory, original_name=original_name,
        stored_shape=stored_shape, unmapped=unmapped, skip=skip,
        skip_example=("cls.",), allow_missing=allow_missing,
    )
    logger.info("Imported %d tensors from %s; skipped %d by request (%s); kept initial "
                "values for %s", len(canonical), directory, len(skipped), skip, absent)
    return backbone


def canonical_to_hf_name(key):
    """The HF name (without `bert.`) of a canonical name; inverse of
    `hf_name_to_canonical` for the weights of a `BertModel`."""
    parts = key.split("/")
    if parts[0] == "embeddings" and parts[1] != "LayerNorm":
        return f"embeddings.{parts[1]}.weight"
    last = {"kernel": "weight", "gamma": "weight", "bias": "bias", "beta": "bias"}[parts[-1]]
    path = ".".join(parts[:-1])
    path = re.sub(r"layer_(\d+)", r"layer.\1", path)
    return f"{path}.{last}"


def _check_position_ids(array, max_sequence_length, name):
    expected = np.arange(max_sequence_length)[None, :]
    if array.shape != expected.shape or not np.array_equal(array, expected):
        raise ValueError(
            f"The buffer {name} should hold the positions 0..{max_sequence_length - 1} "
            "(transformers' default); a checkpoint with other position ids cannot be "
            f"imported as absolute positions. Received: shape={array.shape}"
        )


def _check_vocabulary(directory, vocabulary_size):
    path = os.path.join(directory, "vocab.txt")
    if not os.path.exists(path):
        return
    with open(path, encoding="utf-8") as f:
        lines = sum(1 for _ in f)
    if lines > vocabulary_size:
        raise ValueError(
            f"{path} has {lines} entries but config.json's `vocab_size` is "
            f"{vocabulary_size}: ids past the embedding table would fail. Use the "
            f"vocabulary that belongs to the weights. Received: vocab_size={vocabulary_size}"
        )
