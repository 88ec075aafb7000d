"""Import a Hugging Face GPT-2 checkpoint (`config.json` + `model.safetensors`).

The safetensors file is read with `safetensors.numpy` (no PyTorch). GPT-2 stores its
linear layers as `Conv1D` modules whose weights are already `(in, out)`, the layout of
Keras kernels, so nothing is transposed; the fused `c_attn` `(H, 3H)` matrix (Q, K, V
side by side, heads consecutive inside each) becomes the backbone's fused
`(H, 3, heads, head_dim)` kernel by a reshape.

HF name (optionally under `transformer.`)  ->  keras-attn weight
    wte.weight               embeddings/token_embedding (also the tied LM head)
    wpe.weight               embeddings/position_embedding
    h.N.ln_1.{weight,bias}   transformer_layer_N/self_attention_layer_norm
    h.N.attn.c_attn.*        transformer_layer_N/self_attention qkv_kernel, qkv_bias
    h.N.attn.c_proj.*        transformer_layer_N/self_attention/attention_output
    h.N.ln_2.*               transformer_layer_N/feedforward_layer_norm
    h.N.mlp.c_fc.*           transformer_layer_N/feedforward_intermediate_dense
    h.N.mlp.c_proj.*         transformer_layer_N/feedforward_output_dense
    ln_f.*                   final_layer_norm
"""

import logging
import re

import numpy as np

from keras_attn.checkpoints.checkpoint_files import HF_ACTIVATIONS
from keras_attn.checkpoints.checkpoint_files import raise_for_problems
from keras_attn.checkpoints.checkpoint_files import read_hf_config
from keras_attn.checkpoints.checkpoint_files import read_safetensors
from keras_attn.checkpoints.checkpoint_files import shape_mismatch
from keras_attn.checkpoints.checkpoint_files import tensor_problems
from keras_attn.models.gpt_backbone import GPTBackbone
from keras_attn.models.gpt_causal_lm import GPTCausalLM

logger = logging.getLogger(__name__)

# Options of GPT2Config that change the computation in ways the backbone does not
# implement, with the value it does implement.
_UNSUPPORTED = {
    "scale_attn_weights": True,  # False would drop the 1/sqrt(d_k) scaling
    "scale_attn_by_inverse_layer_idx": False,  # True scales layer l by 1/(l+1)
    "add_cross_attention": False,  # encoder-decoder use of GPT-2
    "tie_word_embeddings": True,  # the LM head is the token embedding
}

_BLOCK = re.compile(
    r"h\.(\d+)\.(ln_1|ln_2|attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.(weight|bias)"
)
# Buffers of older transformers versions, saved next to the weights: the causal mask
# (a lower-triangular (1, 1, n_positions, n_positions) matrix) and the fill value of
# masked scores. They are not weights; the causal mask is checked, then not imported.
_CAUSAL_MASK_BUFFER = re.compile(r"h\.(\d+)\.attn\.bias")
_MASKED_BIAS_BUFFER = re.compile(r"h\.(\d+)\.attn\.masked_bias")


def hf_gpt2_config_to_kwargs(config, source="config.json"):
    """`GPTBackbone` arguments from a transformers `GPT2Config` dict.

    Args:
        config: dict, the parsed `config.json`.
        source: str, named in errors.

    Returns:
        dict of `GPTBackbone` constructor arguments; `dropout` is `resid_pdrop`.

    Raises:
        ValueError: not a GPT-2 config, missing sizes, or options the backbone does not
            implement.

    Example:
    >>> kwargs = hf_gpt2_config_to_kwargs({"model_type": "gpt2", "vocab_size": 50257,
    ...     "n_positions": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12})
    >>> kwargs["intermediate_dim"], kwargs["activation"]
    (3072, 'gelu_approximate')
    """
    def fail(what, key):
        return ValueError(
            f"{source}: {what}. Received: {key}={config.get(key)!r}"
        )

    if config.get("model_type") != "gpt2":
        raise fail("only `model_type` 'gpt2' checkpoints can be imported", "model_type")
    for key in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head"):
        if not isinstance(config.get(key), int) or config[key] <= 0:
            raise fail(f"`{key}` must be a positive integer", key)
    for key, supported in _UNSUPPORTED.items():
        if config.get(key, supported) != supported:
            raise fail(
                f"`{key}={config[key]!r}` is not implemented by GPTBackbone (which "
                f"computes {key}={supported!r})", key,
            )
    activation = config.get("activation_function", "gelu_new")
    if activation not in HF_ACTIVATIONS:
        raise fail(
            f"unsupported `activation_function`; supported: {sorted(HF_ACTIVATIONS)}",
            "activation_function",
        )
    rates = {k: config.get(k, 0.1) for k in ("resid_pdrop", "embd_pdrop", "attn_pdrop")}
    if len(set(rates.values())) > 1:
        logger.warning(
            "%s: GPTBackbone has one dropout rate; using resid_pdrop=%s for embeddings, "
            "attention and residuals (config has %s). Pass `dropout=` to choose another.",
            source, rates["resid_pdrop"], rates,
        )
    return dict(
        vocabulary_size=config["vocab_size"],
        num_layers=config["n_layer"],
        num_heads=config["n_head"],
        hidden_dim=config["n_embd"],
        intermediate_dim=config.get("n_inner") or 4 * config["n_embd"],
        max_sequence_length=config["n_positions"],
        dropout=rates["resid_pdrop"],
        activation=HF_ACTIVATIONS[activation],
        layer_norm_epsilon=config.get("layer_norm_epsilon", 1e-5),
    )


def load_hf_gpt2(directory, *, dtype=None, dropout=None):
    """A `GPTCausalLM` with the weights of a Hugging Face GPT-2 checkpoint directory.

    Reads `config.json` (sizes, `activation_function`, `layer_norm_epsilon`) and
    `model.safetensors` (or its shards) of a `GPT2Model` or `GPT2LMHeadModel` (names with
    or without the `transformer.` prefix). The LM head is tied to `wte`, as in GPT-2: a
    stored `lm_head.weight` must equal `wte.weight`. The buffers `h.N.attn.bias` (checked
    to be the causal mask) and `h.N.attn.masked_bias` that older transformers versions
    saved are not weights and are not imported. Any other tensor the model has no place
    for, any missing weight and any wrong shape raise one `ValueError` listing them all;
    nothing is written before every check passes.

    Args:
        directory: path of the checkpoint directory.
        dtype: dtype policy of the model. Defaults to the global policy.
        dropout: overrides the config's `resid_pdrop` as the model's dropout rate.

    Returns:
        The `GPTCausalLM` (its backbone is `.backbone`).

    Raises:
        ValueError: missing files, unsupported config, or missing, unknown or
            mis-shaped tensors (all listed).
    """
    config, config_path = read_hf_config(directory)
    kwargs = hf_gpt2_config_to_kwargs(config, source=config_path)
    if dropout is not None:
        kwargs["dropout"] = dropout
    tensors = read_safetensors(directory)
    backbone = GPTBackbone(**kwargs, dtype=dtype)
    assign_hf_gpt2_weights(backbone, tensors, source=directory)
    return GPTCausalLM(backbone)


def assign_hf_gpt2_weights(backbone, tensors, source="the checkpoint"):
    """Copies HF GPT-2 `tensors` (name -> numpy array) into `backbone`, or raises.

    Args:
        backbone: the `GPTBackbone` to fill.
        tensors: dict of HF names (with or without `transformer.`) to arrays.
        source: str, named in the error.

    Raises:
        ValueError: listing every missing, unknown and mis-shaped tensor at once.
    """
    prefix = "transformer." if any(n.startswith("transformer.") for n in tensors) else ""
    targets = _weight_targets(backbone)  # hf name (no prefix) -> (variable, shape, convert)
    found, present, unknown, mismatched, buffers = {}, set(), [], [], []
    tied_head = None
    for name in sorted(tensors):
        local = name[len(prefix):] if name.startswith(prefix) else name
        if not name.startswith(prefix) and name != "lm_head.weight":
            unknown.append(name)
            continue
        array = tensors[name]
        if name == "lm_head.weight":
            tied_head = array
        elif local in targets:
            present.add(local)
            expected = targets[local][1]
            if tuple(array.shape) != expected:
                mismatched.append(shape_mismatch(name, array.shape, expected))
            else:
                found[local] = array
        elif _CAUSAL_MASK_BUFFER.fullmatch(local) or _MASKED_BIAS_BUFFER.fullmatch(local):
            buffers.append((name, array))
        else:
            unknown.append(name)
    missing = [prefix + n for n in targets if n not in present]
    problems = tensor_problems(
        missing=missing, unused=unknown, mismatched=mismatched,
        unused_hint=" (a GPT-2 checkpoint with another head, or not GPT-2)",
        config_file="config.json",
    )
    for name, array in buffers:
        problem = _check_buffer(name, array, backbone.max_sequence_length)
        if problem:
            problems.append(problem)
    if tied_head is not None and "wte.weight" in found and not (
        tied_head.shape == found["wte.weight"].shape
        and np.array_equal(tied_head, found["wte.weight"])
    ):
        problems.append(
            "lm_head.weight differs from wte.weight, but GPTCausalLM ties its output "
            "projection to the token embedding (as GPT-2 does); an untied head cannot be "
            "imported"
        )
    raise_for_problems(problems, source=source, target="GPTCausalLM",
                       received=f"{len(tensors)} tensors")
    for local, (variable, _, convert) in targets.items():
        variable.assign(convert(np.asarray(found[local], dtype="float32")))
    logger.info("Imported %d tensors from %s (ignored %d buffers)", len(found), source,
                len(buffers))


def _weight_targets(backbone):
    """HF name (without `transformer.`) -> `(variable, HF shape, HF array -> value)`."""
    H, F = backbone.hidden_dim, backbone.intermediate_dim
    heads = backbone.num_heads
    dk = H // heads
    targets = {}

    def same(array):
        return array

    embeddings = backbone.get_layer("embeddings")
    targets["wte.weight"] = (
        embeddings.token_embedding.embeddings, (backbone.vocabulary_size, H), same
    )
    targets["wpe.weight"] = (
        embeddings.position_embedding.embeddings, (backbone.max_sequence_length, H), same
    )
    for i, block in enumerate(backbone.transformer_layers):
        attention = block.self_attention
        scope = f"h.{i}"
        _add_norm(targets, f"{scope}.ln_1", block.self_attention_layer_norm, H)
        # (H, 3H): [Q | K | V] columns, each heads x dk -> (H, 3, heads, dk).
        targets[f"{scope}.attn.c_attn.weight"] = (
            attention.qkv_kernel, (H, 3 * H), lambda a: a.reshape(H, 3, heads, dk)
        )
        targets[f"{scope}.attn.c_attn.bias"] = (
            attention.qkv_bias, (3 * H,), lambda a: a.reshape(3, heads, dk)
        )
        output = attention.output_dense
        targets[f"{scope}.attn.c_proj.weight"] = (
            output.kernel, (H, H), lambda a: a.reshape(heads, dk, H)
        )
        targets[f"{scope}.attn.c_proj.bias"] = (output.bias, (H,), same)
        _add_norm(targets, f"{scope}.ln_2", block.feedforward_layer_norm, H)
        for name, dense, shape in (
            ("mlp.c_fc", block.feedforward_intermediate_dense, (H, F)),
            ("mlp.c_proj", block.feedforward_output_dense, (F, H)),
        ):
            targets[f"{scope}.{name}.weight"] = (dense.kernel, shape, same)
            targets[f"{scope}.{name}.bias"] = (dense.bias, (shape[1],), same)
    _add_norm(targets, "ln_f", backbone.get_layer("final_layer_norm"), H)
    return targets


def _add_norm(targets, scope, layer_norm, dim):
    targets[f"{scope}.weight"] = (layer_norm.gamma, (dim,), lambda a: a)
    targets[f"{scope}.bias"] = (layer_norm.beta, (dim,), lambda a: a)


def _check_buffer(name, array, max_sequence_length):
    """A problem description if a causal-mask buffer is not the causal mask, else None."""
    if not name.endswith("attn.bias"):
        return None  # masked_bias: a fill value for masked scores, any value is fine
    size = array.shape[-1] if array.ndim == 4 else None
    causal = np.tril(np.ones((size, size), bool)) if size else None
    if size is None or array.shape[:2] != (1, 1) or array.shape[2] != size or not (
        np.array_equal(array[0, 0].astype(bool), causal)
    ):
        return (
            f"the buffer {name} (shape {array.shape}) is not a lower-triangular causal "
            "mask, so the checkpoint does not use GPT-2's causal attention"
        )
    if size < max_sequence_length:
        return (
            f"the causal-mask buffer {name} covers {size} positions, fewer than "
            f"n_positions={max_sequence_length}"
        )
    return None
