"""The layer demo behind `keras-attn demo`: a tiny GPT-style model learns to reverse digits.

It exercises the layer library end to end on something whose right answer is known:
- `TokenAndPositionEmbedding` + causal pre-LN `TransformerDecoderBlock`s + an LM head are
  trained with `model.fit` to continue `x_1 .. x_n >` with `x_n .. x_1`;
- greedy decoding runs token by token through the key/value cache, and its logits are
  compared with recomputing the whole prefix each step (they must agree);
- reversal can only be solved by attending from output step k to input position n-1-k,
  so the learned attention has an anti-diagonal; the demo measures it and draws it.
"""

import json
import pathlib
import time

import keras
import numpy as np
from keras import ops

from keras_attn import atomic_files
from keras_attn.layers.token_and_position_embedding import TokenAndPositionEmbedding
from keras_attn.layers.transformer_decoder_block import TransformerDecoderBlock
from keras_attn.visualization import plot_attention
from keras_attn.visualization import plot_position_encoding

PAD, SEP, FIRST_DIGIT = 0, 1, 2
VOCABULARY_SIZE = FIRST_DIGIT + 10


def make_reversal_data(num_examples, num_digits, seed):
    """`(inputs, targets, weights)` for next-token prediction of `x >  reverse(x)`.

    Sequences are `x_1 .. x_n SEP x_n .. x_1` (length 2n+1); inputs drop the last token,
    targets drop the first, and only the n reversed digits carry loss weight.
    """
    rng = np.random.default_rng(seed)
    digits = rng.integers(0, 10, size=(num_examples, num_digits)) + FIRST_DIGIT
    sep = np.full((num_examples, 1), SEP)
    sequences = np.concatenate([digits, sep, digits[:, ::-1]], axis=1).astype("int32")
    weights = np.zeros((num_examples, 2 * num_digits), "float32")
    weights[:, num_digits:] = 1.0
    return sequences[:, :-1], sequences[:, 1:], weights


def build_model(num_digits, hidden_dim=64, num_heads=4, num_layers=2):
    """A GPT-style causal LM over the 12-token vocabulary (pre-LN blocks, as GPT-2)."""
    token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
    x = TokenAndPositionEmbedding(
        VOCABULARY_SIZE, 2 * num_digits + 1, hidden_dim, name="embedding"
    )(token_ids)
    for i in range(num_layers):
        x = TransformerDecoderBlock(
            num_heads=num_heads, intermediate_dim=4 * hidden_dim, norm_first=True,
            name=f"block_{i}",
        )(x)
    x = keras.layers.LayerNormalization(epsilon=1e-5, name="final_norm")(x)
    logits = keras.layers.Dense(VOCABULARY_SIZE, name="lm_head")(x)
    return keras.Model(token_ids, logits, name="reversal_lm")


def greedy_decode(model, prompts, num_new_tokens):
    """Greedy decoding with one key/value cache per block.

    The prompt is written to the caches in one call (prefill), then each new token costs
    one call on a length-1 input: O(T) work per token instead of O(T^2).

    Returns:
        `(tokens (B, num_new_tokens), logits (B, num_new_tokens, V))` numpy arrays.
    """
    embedding = model.get_layer("embedding")
    blocks = [layer for layer in model.layers if isinstance(layer, TransformerDecoderBlock)]
    final_norm, head = model.get_layer("final_norm"), model.get_layer("lm_head")
    batch, prompt_length = prompts.shape
    total = prompt_length + num_new_tokens
    caches = [
        ops.zeros((batch, 2, total, b.num_heads, b.self_attention.key_dim)) for b in blocks
    ]

    def step(token_ids, index):
        x = embedding(token_ids, start_index=index)
        for i, block in enumerate(blocks):
            x, caches[i] = block(
                x, self_attention_cache=caches[i], self_attention_cache_update_index=index
            )
        return head(final_norm(x))[:, -1]  # (B, V) logits of the next token

    logits = step(ops.convert_to_tensor(prompts), 0)
    tokens, all_logits = [], []
    for t in range(num_new_tokens):
        next_token = ops.cast(ops.argmax(logits, axis=-1), "int32")  # (B,)
        tokens.append(next_token)
        all_logits.append(logits)
        if t + 1 < num_new_tokens:
            logits = step(next_token[:, None], prompt_length + t)
    return (
        ops.convert_to_numpy(ops.stack(tokens, axis=1)),
        ops.convert_to_numpy(ops.stack(all_logits, axis=1)),
    )


def recompute_logits(model, prompts, generated):
    """Logits of each generated position from a full forward pass over the prefix."""
    sequence = np.concatenate([prompts, generated[:, :-1]], axis=1)
    logits = ops.convert_to_numpy(model(sequence))
    return logits[:, prompts.shape[1] - 1:]


def mirror_attention(model, sequence, num_digits):
    """Finds the head that attends most to the mirrored input digit.

    When producing output digit k (query at position n + k), the answer x_{n-k} sits at
    key position n - 1 - k. Returns `(layer, head, mean mass on the mirror, probs (T, T))`.
    """
    x = model.get_layer("embedding")(sequence[None])
    best = (None, None, -1.0, None)
    queries = np.arange(num_digits, 2 * num_digits)
    mirrors = 2 * num_digits - 1 - queries
    for block in [layer for layer in model.layers if isinstance(layer, TransformerDecoderBlock)]:
        x, scores = block(x, return_attention_scores=True)
        probs = ops.convert_to_numpy(scores["self_attention"])[0]  # (H, T, T)
        for head in range(probs.shape[0]):
            mass = float(probs[head, queries, mirrors].mean())
            if mass > best[2]:
                best = (block.name, head, mass, probs[head])
    return best


def _save_model(model, path):
    with atomic_files.atomic_path(path) as temporary:
        model.save(temporary)


def run_demo(output_dir, num_digits=6, train_examples=20000, epochs=3, seed=0, log=None):
    """Trains, decodes, checks the cache and draws the attention; returns a summary dict.

    Args:
        output_dir: where `summary.json`, the model and the PNG figures are written.
        num_digits: length of the strings to reverse.
        train_examples: number of random training strings.
        epochs: passes over them.
        seed: seeds data and initialization (the run is repeatable on one machine).
        log: optional callable receiving progress lines.
    """
    log = log or (lambda message: None)
    output_dir = pathlib.Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    keras.utils.set_random_seed(seed)
    started = time.perf_counter()

    inputs, targets, weights = make_reversal_data(train_examples, num_digits, seed)
    test_inputs, test_targets, _ = make_reversal_data(1000, num_digits, seed + 1)
    prompts, answers = test_inputs[:, : num_digits + 1], test_targets[:, num_digits:]

    model = build_model(num_digits)
    blocks = [layer for layer in model.layers if isinstance(layer, TransformerDecoderBlock)]
    log(f"model: {model.count_params():,} parameters, {len(blocks)} causal pre-LN decoder blocks")
    before, _ = greedy_decode(model, prompts, num_digits)
    accuracy_before = float(np.mean(np.all(before == answers, axis=1)))

    model.compile(
        optimizer=keras.optimizers.AdamW(learning_rate=2e-3, weight_decay=0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        weighted_metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
    )
    train_started = time.perf_counter()
    history = model.fit(
        inputs, targets, sample_weight=weights, batch_size=128, epochs=epochs,
        verbose=2 if log else 0,
    )
    train_seconds = time.perf_counter() - train_started

    generated, cached_logits = greedy_decode(model, prompts, num_digits)
    accuracy_after = float(np.mean(np.all(generated == answers, axis=1)))
    digit_accuracy = float(np.mean(generated == answers))
    full_logits = recompute_logits(model, prompts, generated)
    cache_difference = float(np.max(np.abs(full_logits - cached_logits)))

    example = np.concatenate([prompts[0], generated[0]])
    layer_name, head, mass, probs = mirror_attention(model, example[:-1], num_digits)
    files = {"model": str(output_dir / "reversal_lm.keras")}
    _save_model(model, files["model"])
    try:  # the figures need matplotlib, an optional extra: without it they are skipped
        labels = [_token_text(t) for t in example[:-1]]
        files["attention_png"] = str(output_dir / "attention_mirror_head.png")
        plot_attention(files["attention_png"], probs, labels, labels,
                       title=f"{layer_name}, head {head}: {mass:.0%} on the mirrored digit")
        files["position_encoding_png"] = str(output_dir / "sinusoidal_position_encoding.png")
        plot_position_encoding(files["position_encoding_png"])
    except ImportError as error:
        log(f"figures skipped: {error}")

    summary = {
        "task": f"reverse {num_digits} digits",
        "parameters": model.count_params(),
        "train_examples": train_examples,
        "epochs": epochs,
        "final_train_loss": float(history.history["loss"][-1]),
        "exact_match_before_training": accuracy_before,
        "exact_match_after_training": accuracy_after,
        "digit_accuracy_after_training": digit_accuracy,
        "kv_cache_vs_full_max_abs_logit_difference": cache_difference,
        "mirror_attention": {"layer": layer_name, "head": head, "mean_probability": mass},
        "example": {"input": "".join(_token_text(t) for t in prompts[0]),
                    "output": "".join(_token_text(t) for t in generated[0])},
        "attention_matrix": np.round(probs, 3).tolist(),
        "train_seconds": round(train_seconds, 1),
        "total_seconds": round(time.perf_counter() - started, 1),
        "files": files,
    }
    atomic_files.write_text(output_dir / "summary.json", json.dumps(summary, indent=2))
    files["summary"] = str(output_dir / "summary.json")
    return summary


def _token_text(token):
    return ">" if token == SEP else ("_" if token == PAD else str(int(token) - FIRST_DIGIT))
