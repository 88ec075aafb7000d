import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import ops

from keras_attn.models.gpt_backbone import GPTBackbone
from keras_attn.models.gpt_causal_lm import GPTCausalLM
from keras_attn.models.gpt_causal_lm import copy_head_tables
from keras_attn.quantization import calibrate_model
from keras_attn.quantization import quantize_model

TINY = dict(vocabulary_size=24, num_layers=2, num_heads=2, hidden_dim=16,
            intermediate_dim=32, max_sequence_length=16, dropout=0.0)


def tiny_lm(seed=0, **overrides):
    lm = GPTCausalLM(GPTBackbone(**{**TINY, **overrides}))
    rng = np.random.default_rng(seed)
    lm.set_weights([rng.normal(scale=0.5, size=w.shape) for w in lm.get_weights()])
    return lm


def full_logits(lm, ids):
    ids = np.asarray(ids, "int32")
    return ops.convert_to_numpy(lm({"token_ids": ids, "padding_mask": np.ones_like(ids)}))


def test_logits_are_tied_to_the_token_embedding():
    lm = tiny_lm()
    ids = np.array([[1, 5, 9, 2]], "int32")
    hidden = ops.convert_to_numpy(
        lm.backbone({"token_ids": ids, "padding_mask": np.ones_like(ids)})
    )
    wte = ops.convert_to_numpy(lm.backbone.token_embedding.embeddings)
    np.testing.assert_allclose(full_logits(lm, ids), hidden @ wte.T, atol=1e-4)
    # The head owns no weights: same parameters as the backbone.
    assert lm.count_params() == lm.backbone.count_params()
    assert len(lm.weights) == len(lm.backbone.weights)


def test_cached_logits_equal_full_recomputation():
    lm = tiny_lm(seed=1)
    ids = np.random.default_rng(0).integers(0, 24, size=(3, 9)).astype("int32")
    want = full_logits(lm, ids)
    cache = lm.build_cache(3, 12)
    assert tuple(cache.shape) == (3, 2, 2, 12, 2, 8)  # (B, L, 2, S_max, heads, head_dim)
    logits, cache = lm.call_with_cache(ids[:, :4], cache, 0)  # prefill 4 tokens
    pieces = [ops.convert_to_numpy(logits)]
    for t in range(4, 9):  # then one token at a time
        logits, cache = lm.call_with_cache(ids[:, t:t + 1], cache, t)
        pieces.append(ops.convert_to_numpy(logits))
    np.testing.assert_allclose(np.concatenate(pieces, axis=1), want, atol=1e-4)
    # The cache holds each block's keys/values at the positions written, zeros after.
    assert np.abs(ops.convert_to_numpy(cache)[:, :, :, 9:]).max() == 0.0


def test_greedy_generate_equals_full_prefix_argmax_loop():
    lm = tiny_lm(seed=2)
    prompt = np.array([[3, 1, 4], [15, 9, 2]], "int32")
    got = ops.convert_to_numpy(lm.generate(prompt, max_new_tokens=6))
    want = prompt.copy()
    for _ in range(6):
        next_token = full_logits(lm, want)[:, -1].argmax(-1)
        want = np.concatenate([want, next_token[:, None].astype("int32")], axis=1)
    np.testing.assert_array_equal(got, want)


def test_beam_search_with_one_beam_is_greedy_and_more_beams_score_higher():
    lm = tiny_lm(seed=3)
    prompt = np.array([[7, 7, 1]], "int32")
    greedy = ops.convert_to_numpy(lm.generate(prompt, max_new_tokens=5))
    one, _ = lm.beam_search(prompt, max_new_tokens=5, num_beams=1)
    np.testing.assert_array_equal(ops.convert_to_numpy(one), greedy)

    def log_prob(sequence):
        logits = full_logits(lm, sequence[None, :-1])[0, 2:]  # predictions of new tokens
        logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1,
                                                                              keepdims=True))
        logp -= logits.max(-1, keepdims=True)
        return logp[np.arange(5), sequence[3:]].sum()

    _, scores1 = lm.beam_search(prompt, max_new_tokens=5, num_beams=1, length_penalty=0.0)
    sequences4, scores4 = lm.beam_search(prompt, max_new_tokens=5, num_beams=4,
                                         length_penalty=0.0)
    sequences4 = ops.convert_to_numpy(sequences4)[0]
    # The reported score is the log-probability of the returned sequence, recomputed
    # without the cache, and a wider beam never finds a worse one.
    np.testing.assert_allclose(ops.convert_to_numpy(scores4)[0], log_prob(sequences4),
                               rtol=1e-4)
    np.testing.assert_allclose(ops.convert_to_numpy(scores1)[0], log_prob(greedy[0]),
                               rtol=1e-4)
    assert ops.convert_to_numpy(scores4)[0] >= ops.convert_to_numpy(scores1)[0] - 1e-6


def test_sampling_is_deterministic_given_a_seed_and_respects_top_k():
    lm = tiny_lm(seed=4)
    prompt = np.array([[2, 3]] * 4, "int32")

    def run(seed, **kwargs):
        return ops.convert_to_numpy(
            lm.generate(prompt, max_new_tokens=6, sampler="sample", seed=seed, **kwargs)
        )

    first = run(11)
    np.testing.assert_array_equal(run(11), first)
    assert (run(12) != first).any()
    # top_k=1 sampling is greedy.
    np.testing.assert_array_equal(run(5, top_k=1), ops.convert_to_numpy(
        lm.generate(prompt, max_new_tokens=6)))


def test_stop_token_pads_the_rest():
    lm = tiny_lm(seed=2)
    prompt = np.array([[3, 1, 4], [15, 9, 2]], "int32")
    free = ops.convert_to_numpy(lm.generate(prompt, max_new_tokens=6))
    stop = int(free[0, 4])
    got = ops.convert_to_numpy(
        lm.generate(prompt, max_new_tokens=6, stop_token_ids=(stop,), pad_token_id=23)
    )
    first = 3 + list(free[0, 3:]).index(stop)
    np.testing.assert_array_equal(got[0, :first + 1], free[0, :first + 1])
    assert (got[0, first + 1:] == 23).all()


@pytest.mark.tensorflow
def test_decoding_traces_under_tf_function():
    lm = tiny_lm(seed=5, num_layers=1)
    prompt = np.array([[3, 1, 4], [1, 5, 9]], "int32")

    @tf.function
    def decode(prompt):
        greedy = lm.generate(prompt, max_new_tokens=5)
        sampled = lm.generate(prompt, max_new_tokens=5, sampler="sample", seed=3, top_p=0.9)
        beams, scores = lm.beam_search(prompt, max_new_tokens=5, num_beams=3)
        return greedy, sampled, beams, scores

    traced = [ops.convert_to_numpy(x) for x in decode(tf.constant(prompt))]
    eager = [ops.convert_to_numpy(x) for x in (
        lm.generate(prompt, max_new_tokens=5),
        lm.generate(prompt, max_new_tokens=5, sampler="sample", seed=3, top_p=0.9),
        *lm.beam_search(prompt, max_new_tokens=5, num_beams=3),
    )]
    for want, got in zip(eager[:3], traced[:3]):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(traced[3], eager[3], rtol=1e-5)


def test_fit_overfits_a_tiny_batch_and_ignores_padding():
    keras.utils.set_random_seed(0)
    lm = GPTCausalLM(GPTBackbone(**TINY))
    ids = np.array([[1, 5, 9, 13, 17, 21, 0, 0], [2, 4, 6, 8, 10, 12, 14, 16]], "int32")
    mask = np.array([[1, 1, 1, 1, 1, 1, 0, 0], [1] * 8], "int32")
    x = {"token_ids": ids[:, :-1], "padding_mask": mask[:, :-1]}
    y, weights = ids[:, 1:], mask[:, 1:].astype("float32")
    lm.compile(optimizer=keras.optimizers.Adam(0.01),
               loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
               weighted_metrics=[])
    first = lm.evaluate(x, y, sample_weight=weights, verbose=0)
    # 60 steps on the same batch, as one epoch (less per-epoch overhead than 60 epochs).
    repeat = lambda a: np.concatenate([a] * 60)
    lm.fit({k: repeat(v) for k, v in x.items()}, repeat(y), sample_weight=repeat(weights),
           epochs=1, batch_size=2, shuffle=False, verbose=0)
    loss = lm.evaluate(x, y, sample_weight=weights, verbose=0)
    assert loss < 0.05 < first
    predicted = full_logits(lm, ids[:, :-1]).argmax(-1)
    np.testing.assert_array_equal(predicted[weights > 0], y[weights > 0])
    # The padded targets carry no weight: changing them leaves the loss unchanged.
    other_y = y.copy()
    other_y[0, -2:] = [3, 3]
    other = lm.evaluate(x, other_y, sample_weight=weights, verbose=0)
    np.testing.assert_allclose(loss, other, rtol=1e-6)


def test_keras_save_load_keeps_the_tied_head(tmp_path):
    lm = tiny_lm(seed=6)
    ids = np.array([[1, 2, 3]], "int32")
    path = os.path.join(tmp_path, "lm.keras")
    lm.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded, GPTCausalLM)
    np.testing.assert_allclose(full_logits(loaded, ids), full_logits(lm, ids), atol=1e-5)
    assert loaded.get_layer("lm_head").embedding() is loaded.backbone.token_embedding
    np.testing.assert_array_equal(
        ops.convert_to_numpy(loaded.generate(ids, 4)), ops.convert_to_numpy(lm.generate(ids, 4))
    )


def test_a_config_copy_of_the_quantized_model_gets_the_head_table():
    """The trainer saves a `from_config` copy with `set_weights`: the QAT copy's head reads
    a table of its own, which only `copy_head_tables` fills."""
    qat = quantize_model(tiny_lm(seed=7))
    ids = np.array([[1, 2, 3, 9]], "int32")
    calibrate_model(qat, [{"token_ids": ids, "padding_mask": np.ones_like(ids)}])
    copy = qat.__class__.from_config(qat.get_config())
    copy.set_weights(qat.get_weights())
    assert np.abs(full_logits(copy, ids) - full_logits(qat, ids)).max() > 0.1
    copy_head_tables(qat, copy)
    np.testing.assert_allclose(full_logits(copy, ids), full_logits(qat, ids), atol=1e-5)


def test_errors():
    lm = tiny_lm()
    with pytest.raises(ValueError, match="prompt_length \\+ max_new_tokens.*=17"):
        lm.generate(np.zeros((1, 9), "int32"), max_new_tokens=8)
    with pytest.raises(ValueError, match="max_new_tokens=-1"):
        lm.beam_search(np.zeros((1, 2), "int32"), max_new_tokens=-1, num_beams=2)
    with pytest.raises(ValueError, match="GPTBackbone"):
        GPTCausalLM(keras.Sequential([keras.layers.Dense(2)]))


@pytest.mark.tensorflow  # TFLite conversion
@pytest.mark.parametrize("layer_position_embeddings", [False, True])
def test_the_decoding_step_model_generates_as_the_model_and_becomes_a_file(
        tmp_path, layer_position_embeddings):
    """`decoder_step_model`: the prompt and then each generated token through the step
    (the cache a tensor in and out) give `generate`'s greedy tokens, in Keras and as a
    batch-1 builtins-only `.tflite` file on LiteRT (logits within float error)."""
    from ai_edge_litert.interpreter import Interpreter

    from keras_attn.export.tflite.model_int8_tflite import export_model_fp32_tflite

    lm = tiny_lm(seed=7, layer_position_embeddings=layer_position_embeddings)
    prompt = [3, 1, 4]
    expected = ops.convert_to_numpy(lm.generate(np.array([prompt], "int32"), 8))[0]
    step = lm.decoder_step_model(max_length=11)
    report = export_model_fp32_tflite(step, tmp_path / "step.tflite")
    assert not report["custom_ops"]
    runner = Interpreter(model_path=report["path"]).get_signature_runner()
    for run in (lambda x: {k: np.asarray(v) for k, v in step(x).items()},
                lambda x: runner(**x)):
        tokens, cache = list(prompt), np.zeros((1, 2, 2, 11, 2, 8), "float32")
        for index in range(10):
            out = run({"token_ids": np.array([[tokens[index]]], "int32"),
                       "cache_update_index": np.array([index], "int32"), "cache": cache})
            cache = out["cache"]
            if index >= len(prompt) - 1:
                tokens.append(int(out["logits"].argmax(-1)[0]))
        np.testing.assert_array_equal(tokens, expected)
