"""What the BERT checkpoint importers share: the weight map of a `BertBackbone` and one
all-or-nothing assignment that lists every problem at once.

Both importers translate their files into one *canonical* naming — Google's original
TensorFlow names without the `bert/` scope, with kernels in the `(in, out)` layout of
`keras.layers.Dense` (e.g. `encoder/layer_0/attention/self/query/kernel`) — and hand the
arrays to `assign_bert_weights`. That function checks everything before it writes
anything:

- a weight the model needs but the checkpoint lacks is *missing*;
- a checkpoint tensor nothing consumed is *unused* (task heads such as `cls/...`,
  optimizer slots): pass its prefix in `skip` to leave it out on purpose;
- a tensor whose shape differs from the one the config implies is *mismatched*.

Any of the three raises one `ValueError` listing all of them under the checkpoint's own
names and layouts. The only weights that may be absent are the pooler's
(`allow_missing=("pooler",)`): some checkpoints are saved without it; the pooler then
keeps its random initial values, and `pooled_output` is not pretrained.
"""

import numpy as np

from keras_attn.checkpoints.checkpoint_files import raise_for_problems
from keras_attn.checkpoints.checkpoint_files import shape_mismatch
from keras_attn.checkpoints.checkpoint_files import tensor_problems

ALLOWED_MISSING = ("pooler",)
# The size fields of Google's `bert_config.json`, kept by transformers' `BertConfig`.
BERT_SIZE_FIELDS = ("vocab_size", "num_hidden_layers", "num_attention_heads", "hidden_size",
                    "intermediate_size", "max_position_embeddings", "type_vocab_size")


def bert_config_to_kwargs(config, *, source, config_name, activation, layer_norm_epsilon):
    """`BertBackbone` arguments from the fields Google's `bert_config.json` and
    transformers' `BertConfig` share (sizes and dropout rates; validated).

    Args:
        config: dict, the parsed config file.
        source: str, the config file, named in errors.
        config_name: str, the kind of config, named in errors (`"BertConfig"`).
        activation: our name of the activation (each importer reads `hidden_act` its own
            way: Google's "gelu" is the tanh approximation, transformers' the erf form).
        layer_norm_epsilon: float.

    Raises:
        ValueError: a size field is absent, or the hidden and attention dropout rates
            differ (`BertBackbone` has one).
    """
    absent = [key for key in BERT_SIZE_FIELDS if key not in config]
    if absent:
        raise ValueError(
            f"{source} lacks the size field(s) {absent} of a {config_name}. "
            f"Received: keys={sorted(config)}"
        )
    dropout = config.get("hidden_dropout_prob", 0.1)
    attention_dropout = config.get("attention_probs_dropout_prob", dropout)
    if attention_dropout != dropout:
        raise ValueError(
            f"{source}: BertBackbone uses one dropout rate for hidden states and attention "
            "probabilities; this config has two. Pass `dropout=` to choose one. Received: "
            f"hidden_dropout_prob={dropout}, attention_probs_dropout_prob={attention_dropout}"
        )
    return dict(
        vocabulary_size=config["vocab_size"],
        num_layers=config["num_hidden_layers"],
        num_heads=config["num_attention_heads"],
        hidden_dim=config["hidden_size"],
        intermediate_dim=config["intermediate_size"],
        max_sequence_length=config["max_position_embeddings"],
        num_segments=config["type_vocab_size"],
        dropout=dropout,
        activation=activation,
        layer_norm_epsilon=layer_norm_epsilon,
    )


def check_allow_missing(allow_missing):
    """Validates the `allow_missing` argument of the importers; returns it as a tuple."""
    allow_missing = tuple(allow_missing)
    unknown = [group for group in allow_missing if group not in ALLOWED_MISSING]
    if unknown:
        raise ValueError(
            f"`allow_missing` may only name {ALLOWED_MISSING} (the pooler is the one part "
            "some BERT checkpoints omit). Received: "
            f"allow_missing={allow_missing}"
        )
    return allow_missing


# Canonical names of BERT's weights by role.
BERT_EMBEDDING_WEIGHT_NAMES = {
    "token_embeddings": ("embeddings/word_embeddings",),
    "segment_embeddings": ("embeddings/token_type_embeddings",),
    "position_embeddings": ("embeddings/position_embeddings",),
    "gamma": ("embeddings/LayerNorm/gamma",),
    "beta": ("embeddings/LayerNorm/beta",),
}
BERT_POOLER_WEIGHT_NAMES = {
    "kernel": ("pooler/dense/kernel",),
    "bias": ("pooler/dense/bias",),
}


def bert_block_weight_names(index):
    """Canonical names of the weights of encoder block `index`, by role (Q, K, V in that
    order for the fused projection).

    Example:
    >>> bert_block_weight_names(0)["qkv_bias"][2]
    'encoder/layer_0/attention/self/value/bias'
    """
    scope = f"encoder/layer_{index}"
    qkv = [f"{scope}/attention/self/{part}" for part in ("query", "key", "value")]
    return {
        "qkv_kernel": tuple(f"{name}/kernel" for name in qkv),
        "qkv_bias": tuple(f"{name}/bias" for name in qkv),
        "output_kernel": (f"{scope}/attention/output/dense/kernel",),
        "output_bias": (f"{scope}/attention/output/dense/bias",),
        "attention_gamma": (f"{scope}/attention/output/LayerNorm/gamma",),
        "attention_beta": (f"{scope}/attention/output/LayerNorm/beta",),
        "intermediate_kernel": (f"{scope}/intermediate/dense/kernel",),
        "intermediate_bias": (f"{scope}/intermediate/dense/bias",),
        "feedforward_output_kernel": (f"{scope}/output/dense/kernel",),
        "feedforward_output_bias": (f"{scope}/output/dense/bias",),
        "feedforward_gamma": (f"{scope}/output/LayerNorm/gamma",),
        "feedforward_beta": (f"{scope}/output/LayerNorm/beta",),
    }


def bert_weight_targets(backbone):
    """The weights of a `BertBackbone`, as `(variable, canonical_names, combine)` triples.

    `combine(arrays)` turns the canonical-layout arrays of `canonical_names` into the
    variable's value. Also returns a dict `canonical_name -> expected shape` in the
    canonical `(in, out)` layout.
    """
    H = backbone.hidden_dim
    heads = backbone.num_heads
    dk = H // heads
    targets = []
    shapes = {}

    def add(variable, names, expected, combine=lambda a: a[0]):
        for name, shape in zip(names, expected):
            shapes[name] = tuple(shape)
        targets.append((variable, tuple(names), combine))

    names = BERT_EMBEDDING_WEIGHT_NAMES
    embeddings = backbone.get_layer("embeddings")
    add(embeddings.token_embedding.embeddings, names["token_embeddings"],
        [(backbone.vocabulary_size, H)])
    add(embeddings.segment_embedding.embeddings, names["segment_embeddings"],
        [(backbone.num_segments, H)])
    add(embeddings.position_embedding.embeddings, names["position_embeddings"],
        [(backbone.max_sequence_length, H)])
    _add_layer_norm(add, backbone.get_layer("embeddings_layer_norm"), names["gamma"],
                    names["beta"], H)

    for i, block in enumerate(backbone.transformer_layers):
        names = bert_block_weight_names(i)
        attention = block.self_attention
        if attention.fused_qkv:
            # (H, H) x 3 -> (H, 3, heads, dk): one fused projection, Q then K then V.
            add(attention.qkv_kernel, names["qkv_kernel"], [(H, H)] * 3,
                lambda a: np.stack(a, axis=1).reshape(H, 3, heads, dk))
            add(attention.qkv_bias, names["qkv_bias"], [(H,)] * 3,
                lambda a: np.stack(a, axis=0).reshape(3, heads, dk))
        else:
            for kernel, bias, dense in zip(names["qkv_kernel"], names["qkv_bias"], (
                    attention.query_dense, attention.key_dense, attention.value_dense)):
                add(dense.kernel, [kernel], [(H, H)], lambda a: a[0].reshape(H, heads, dk))
                add(dense.bias, [bias], [(H,)], lambda a: a[0].reshape(heads, dk))
        output = attention.output_dense
        add(output.kernel, names["output_kernel"], [(H, H)],
            lambda a: a[0].reshape(heads, dk, H))
        add(output.bias, names["output_bias"], [(H,)])
        _add_layer_norm(add, block.self_attention_layer_norm, names["attention_gamma"],
                        names["attention_beta"], H)
        F = block.intermediate_dim
        _add_dense(add, block.feedforward_intermediate_dense, names["intermediate_kernel"],
                   names["intermediate_bias"], H, F)
        _add_dense(add, block.feedforward_output_dense, names["feedforward_output_kernel"],
                   names["feedforward_output_bias"], F, H)
        _add_layer_norm(add, block.feedforward_layer_norm, names["feedforward_gamma"],
                        names["feedforward_beta"], H)

    _add_dense(add, backbone.get_layer("pooled_dense"), BERT_POOLER_WEIGHT_NAMES["kernel"],
               BERT_POOLER_WEIGHT_NAMES["bias"], H, H)
    return targets, shapes


def _add_dense(add, dense, kernel_names, bias_names, fan_in, fan_out):
    add(dense.kernel, kernel_names, [(fan_in, fan_out)])
    add(dense.bias, bias_names, [(fan_out,)])


def _add_layer_norm(add, layer_norm, gamma_names, beta_names, dim):
    add(layer_norm.gamma, gamma_names, [(dim,)])
    add(layer_norm.beta, beta_names, [(dim,)])


def assign_bert_weights(
    backbone, tensors, *, source, original_name, stored_shape, unmapped=(), skip=(),
    skip_example=("cls",), allow_missing=(),
):
    """Copies canonical-layout `tensors` into `backbone`, or raises listing every problem.

    Nothing is written unless every check passes.

    Args:
        backbone: the `BertBackbone` to fill.
        tensors: dict `canonical_name -> np.ndarray` (canonical `(in, out)` layout) of
            the checkpoint tensors whose names translate to canonical ones.
        source: str, the checkpoint (path), named in the error.
        original_name: callable, canonical name -> its name in the checkpoint.
        stored_shape: callable `(canonical_name, canonical_shape) -> shape as stored` in
            the checkpoint (HF stores linear weights transposed).
        unmapped: checkpoint names with no canonical translation (after `skip`).
        skip: the prefixes the caller excluded, quoted in the error.
        skip_example: prefixes suggested in the error for unused tensors.
        allow_missing: subset of `ALLOWED_MISSING`.

    Returns:
        The canonical names that were absent and allowed to be (left at their initial
        values).

    Raises:
        ValueError: listing the missing, unused and mismatched tensors.
    """
    targets, shapes = bert_weight_targets(backbone)
    missing, mismatched, allowed_missing = [], [], []
    for name, expected in shapes.items():
        if name not in tensors:
            group = name.split("/")[0]
            (allowed_missing if group in allow_missing else missing).append(name)
        elif tuple(tensors[name].shape) != expected:
            mismatched.append(shape_mismatch(
                original_name(name), stored_shape(name, tuple(tensors[name].shape)),
                stored_shape(name, expected)))
    unused = sorted(list(unmapped) + [original_name(n) for n in tensors if n not in shapes])
    problems = tensor_problems(
        missing=[original_name(n) for n in missing],
        missing_hint=(" (a checkpoint saved without its pooler loads with "
                      "allow_missing=('pooler',))"
                      if any(n.startswith("pooler/") for n in missing) else ""),
        unused=unused,
        unused_hint=("; they are not dropped silently: if they are task heads or optimizer "
                     "state you do not need, exclude their prefixes, e.g. "
                     f"skip={tuple(skip_example)!r}"),
        mismatched=mismatched,
    )
    raise_for_problems(
        problems, source=source, target=type(backbone).__name__,
        received=f"skip={tuple(skip)!r}, allow_missing={tuple(allow_missing)!r}",
    )
    for variable, names, combine in targets:
        if any(n in allowed_missing for n in names):
            continue
        value = combine([np.asarray(tensors[n], dtype="float32") for n in names])
        variable.assign(value)
    return allowed_missing


def strip_skipped(names, skip):
    """Splits checkpoint `names` into `(kept, skipped)` by the `skip` prefixes."""
    if isinstance(skip, str) or not all(isinstance(p, str) and p for p in skip):
        raise ValueError(
            "`skip` must be a tuple of non-empty name prefixes, e.g. ('cls',). "
            f"Received: skip={skip!r}"
        )
    skip = tuple(skip)
    kept = [n for n in names if not n.startswith(skip)]
    return kept, [n for n in names if n.startswith(skip)]
