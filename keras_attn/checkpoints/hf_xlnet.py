"""Import a Hugging Face XLNet checkpoint (`config.json` + `model.safetensors`).

The safetensors file is read with `safetensors.numpy` — no PyTorch. transformers stores
the attention projections as `(d_model, n_head, d_head)` tensors used by einsum, which
are already the layout of our `EinsumDense` kernels, except the output projection `o`
(transposed to `(n_head, d_head, d_model)`); `nn.Linear` weights are transposed.
"""

import logging

import numpy as np

from keras_attn.checkpoints.checkpoint_files import HF_ACTIVATIONS
from keras_attn.checkpoints.checkpoint_files import raise_for_problems
from keras_attn.checkpoints.checkpoint_files import read_hf_config
from keras_attn.checkpoints.checkpoint_files import read_safetensors
from keras_attn.checkpoints.checkpoint_files import shape_mismatch
from keras_attn.checkpoints.checkpoint_files import tensor_problems
from keras_attn.models.xlnet_backbone import XLNetBackbone
from keras_attn.models.xlnet_lm import XLNetLM

logger = logging.getLogger(__name__)

# Options of XLNetConfig that change the computation in ways XLNetBackbone does not
# implement, with the value it implements.
_UNSUPPORTED = {"attn_type": "bi", "bi_data": False, "clamp_len": -1,
                "same_length": False, "reuse_len": None}

_IDENTITY = lambda array: array  # noqa: E731
_TRANSPOSE = lambda array: array.T  # noqa: E731
# transformers' name under `transformer.layer.{i}.` -> (our sublayer path, conversion).
_LAYER_TENSORS = {
    "rel_attn.q": ("attention/query_dense/kernel", _IDENTITY),
    "rel_attn.k": ("attention/key_dense/kernel", _IDENTITY),
    "rel_attn.v": ("attention/value_dense/kernel", _IDENTITY),
    "rel_attn.o": ("attention/output_dense/kernel", lambda a: a.transpose(1, 2, 0)),
    "rel_attn.r": ("attention/position_dense/kernel", _IDENTITY),
    "rel_attn.r_w_bias": ("attention/content_bias", _IDENTITY),
    "rel_attn.r_r_bias": ("attention/position_bias", _IDENTITY),
    "rel_attn.r_s_bias": ("attention/segment_bias", _IDENTITY),
    "rel_attn.seg_embed": ("attention/segment_embedding", _IDENTITY),
    "rel_attn.layer_norm.weight": ("attention_layer_norm/gamma", _IDENTITY),
    "rel_attn.layer_norm.bias": ("attention_layer_norm/beta", _IDENTITY),
    "ff.layer_1.weight": ("feedforward_intermediate_dense/kernel", _TRANSPOSE),
    "ff.layer_1.bias": ("feedforward_intermediate_dense/bias", _IDENTITY),
    "ff.layer_2.weight": ("feedforward_output_dense/kernel", _TRANSPOSE),
    "ff.layer_2.bias": ("feedforward_output_dense/bias", _IDENTITY),
    "ff.layer_norm.weight": ("feedforward_layer_norm/gamma", _IDENTITY),
    "ff.layer_norm.bias": ("feedforward_layer_norm/beta", _IDENTITY),
}


def hf_xlnet_config_to_kwargs(config, source="config.json"):
    """`XLNetBackbone` arguments from a transformers `XLNetConfig` dict (validated).

    Raises:
        ValueError: another `model_type`, an option the backbone does not implement
            (`attn_type` other than "bi", `bi_data`, `clamp_len`, `same_length`,
            `reuse_len`), an unknown activation or `d_head * n_head != d_model`.

    Example:
    >>> hf_xlnet_config_to_kwargs({"model_type": "xlnet", "vocab_size": 50, "d_model": 16,
    ...     "n_layer": 2, "n_head": 2, "d_head": 8, "d_inner": 32})["intermediate_dim"]
    32
    """
    def fail(what, key):
        return ValueError(f"{source}: {what}. Received: {key}={config.get(key)!r}")

    if config.get("model_type") != "xlnet":
        raise fail("only `model_type` 'xlnet' checkpoints can be imported", "model_type")
    for key, value in _UNSUPPORTED.items():
        if config.get(key, value) != value:
            raise fail(f"XLNetBackbone implements only `{key}`={value!r}", key)
    activation = config.get("ff_activation", "gelu")
    if activation not in HF_ACTIVATIONS:
        raise fail(f"`ff_activation` must be one of {sorted(HF_ACTIVATIONS)}",
                   "ff_activation")
    try:
        sizes = {name: config[key] for name, key in (
            ("vocabulary_size", "vocab_size"), ("num_layers", "n_layer"),
            ("num_heads", "n_head"), ("hidden_dim", "d_model"),
            ("intermediate_dim", "d_inner"))}
    except KeyError as error:
        raise ValueError(f"{source}: XLNetConfig field {error} is missing. Received: "
                         f"keys={sorted(config)}") from None
    if config.get("d_head", sizes["hidden_dim"] // sizes["num_heads"]) * sizes[
            "num_heads"] != sizes["hidden_dim"]:
        raise fail("`d_head * n_head` must equal `d_model`", "d_head")
    return dict(sizes, dropout=config.get("dropout", 0.1),
                activation=HF_ACTIVATIONS[activation],
                layer_norm_epsilon=config.get("layer_norm_eps", 1e-12))


def load_hf_xlnet(directory, *, two_stream=True, memory_length="config", skip=(),
                  dtype=None, dropout=None):
    """An `XLNetLM` (or `XLNetBackbone`) with the weights of an HF XLNet checkpoint.

    Reads `config.json` and `model.safetensors` (sharded files too). Tensors of
    `XLNetModel` and of `XLNetLMHeadModel` (under `transformer.`, plus `lm_loss.bias`;
    `lm_loss.weight`, when stored, must equal the tied embedding) are accepted. Nothing
    is dropped silently: tensors with no place in the model (e.g. another task head)
    raise a `ValueError` listing them unless their prefix is in `skip`; missing tensors
    and wrong shapes are listed in the same error.

    Args:
        directory: the checkpoint directory.
        two_stream: return an `XLNetLM` on a two-stream backbone (needs `lm_loss.bias`).
            `False`: a content-stream `XLNetBackbone` (skip `("lm_loss.",)` for an LM
            checkpoint). Defaults to `True`.
        memory_length: the backbone's memory length; `"config"` uses `mem_len` of
            config.json (`None` there means no memory). Defaults to `"config"`.
        skip: tuple of tensor-name prefixes to leave out on purpose. Defaults to `()`.
        dtype: dtype policy. Defaults to the global policy.
        dropout: overrides the config's dropout.

    Returns:
        The `XLNetLM` or `XLNetBackbone`.

    Raises:
        ValueError: unsupported config, missing files, and missing, unused or
            mismatched tensors (all listed).
    """
    config, config_path = read_hf_config(directory)
    kwargs = hf_xlnet_config_to_kwargs(config, source=config_path)
    if dropout is not None:
        kwargs["dropout"] = dropout
    if memory_length == "config":
        memory_length = config.get("mem_len") or None
    backbone = XLNetBackbone(**kwargs, two_stream=two_stream, memory_length=memory_length,
                             dtype=dtype)
    model = XLNetLM(backbone) if two_stream else backbone
    tensors = {name: array for name, array in read_safetensors(directory).items()
               if not name.startswith(tuple(skip))}
    targets = _weight_targets(model, backbone)
    problems, found = [], {}
    embedding = tensors.get("transformer.word_embedding.weight")
    tied = tensors.pop("lm_loss.weight", None) if two_stream else None
    if tied is not None and (
            embedding is None or not np.array_equal(tied, embedding)):
        problems.append("lm_loss.weight differs from transformer.word_embedding.weight, "
                        "but XLNetLM ties its output to the embedding")
    mismatched, unused = [], []
    for name, array in sorted(tensors.items()):
        if name not in targets:
            unused.append(name)
            continue
        variable, convert = targets[name]
        value = convert(np.asarray(array, dtype="float32"))
        if tuple(value.shape) != tuple(variable.shape):
            mismatched.append(shape_mismatch(name, array.shape, variable.shape))
        found[name] = value
    missing = sorted(set(targets) - set(found))
    problems = tensor_problems(
        missing=missing, unused=unused, mismatched=mismatched,
        unused_hint=" (another task head: leave it out with skip=('<prefix>',))",
        config_file="config.json") + problems
    raise_for_problems(problems, source=directory, target=type(model).__name__,
                       received=f"two_stream={two_stream}, skip={tuple(skip)}")
    for name, value in found.items():
        targets[name][0].assign(value)
    logger.info("Imported %d tensors from %s", len(found), directory)
    return model


def _weight_targets(model, backbone):
    """transformers tensor name -> (variable, conversion) for every weight of `model`."""
    targets = {"transformer.word_embedding.weight": (
        backbone.token_embedding.embeddings, _IDENTITY)}
    if backbone.two_stream:
        targets["transformer.mask_emb"] = (
            backbone.get_layer("query_stream_start").start,
            lambda a: a.reshape(a.shape[-1]))
        targets["lm_loss.bias"] = (model.get_layer("lm_bias").bias, _IDENTITY)
    for i, block in enumerate(backbone.transformer_layers):
        for local, (path, convert) in _LAYER_TENSORS.items():
            *sublayers, weight = path.split("/")
            owner = block
            for sublayer in sublayers:
                owner = getattr(owner, sublayer)
            targets[f"transformer.layer.{i}.{local}"] = (getattr(owner, weight), convert)
    return targets
