"""BERT checkpoint import (HF safetensors and Google TF checkpoints) on tiny synthetic
checkpoints: numbers against a numpy BERT written from the HF tensors, and every error."""

import json
import math
import os

import numpy as np
import pytest
from keras import ops
from safetensors.numpy import save_file

from keras_attn.checkpoints.google_bert import load_google_bert
from keras_attn.checkpoints.hf_bert import load_hf_bert

HF_CONFIG = {
    "architectures": ["BertModel"], "model_type": "bert", "vocab_size": 30,
    "hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2,
    "intermediate_size": 16, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1, "max_position_embeddings": 12,
    "type_vocab_size": 2, "layer_norm_eps": 1e-12, "position_embedding_type": "absolute",
}


def hf_tensors(config=HF_CONFIG, seed=0, prefix=""):
    """Random tensors with transformers' BertModel names and (out, in) Linear layout."""
    rng = np.random.default_rng(seed)
    H, F = config["hidden_size"], config["intermediate_size"]

    def r(*shape):
        return rng.normal(scale=0.5, size=shape).astype("float32")

    t = {
        "embeddings.word_embeddings.weight": r(config["vocab_size"], H),
        "embeddings.position_embeddings.weight": r(config["max_position_embeddings"], H),
        "embeddings.token_type_embeddings.weight": r(config["type_vocab_size"], H),
        "embeddings.LayerNorm.weight": 1 + r(H), "embeddings.LayerNorm.bias": r(H),
        "embeddings.position_ids": np.arange(config["max_position_embeddings"])[None],
        "pooler.dense.weight": r(H, H), "pooler.dense.bias": r(H),
    }
    for i in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        for name in ("attention.self.query", "attention.self.key", "attention.self.value",
                     "attention.output.dense"):
            t[p + name + ".weight"], t[p + name + ".bias"] = r(H, H), r(H)
        t[p + "intermediate.dense.weight"], t[p + "intermediate.dense.bias"] = r(F, H), r(F)
        t[p + "output.dense.weight"], t[p + "output.dense.bias"] = r(H, F), r(H)
        for norm in ("attention.output.LayerNorm", "output.LayerNorm"):
            t[p + norm + ".weight"], t[p + norm + ".bias"] = 1 + r(H), r(H)
    return {prefix + k: v for k, v in t.items()}


def write_hf_checkpoint(directory, tensors, config=HF_CONFIG, vocab_lines=None):
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f)
    save_file(tensors, os.path.join(directory, "model.safetensors"))
    lines = config["vocab_size"] if vocab_lines is None else vocab_lines
    with open(os.path.join(directory, "vocab.txt"), "w") as f:
        f.write("".join(f"tok{i}\n" for i in range(lines)))
    return str(directory)


def google_variables(hf, config=HF_CONFIG):
    """HF tensors renamed to Google's original TF names, kernels (in, out) (the mapping of
    transformers' convert_bert_original_tf_checkpoint_to_pytorch, written out here)."""
    g = {
        "bert/embeddings/word_embeddings": hf["embeddings.word_embeddings.weight"],
        "bert/embeddings/position_embeddings": hf["embeddings.position_embeddings.weight"],
        "bert/embeddings/token_type_embeddings": hf["embeddings.token_type_embeddings.weight"],
        "bert/embeddings/LayerNorm/gamma": hf["embeddings.LayerNorm.weight"],
        "bert/embeddings/LayerNorm/beta": hf["embeddings.LayerNorm.bias"],
        "bert/pooler/dense/kernel": hf["pooler.dense.weight"].T,
        "bert/pooler/dense/bias": hf["pooler.dense.bias"],
    }
    for i in range(config["num_hidden_layers"]):
        src, dst = f"encoder.layer.{i}.", f"bert/encoder/layer_{i}/"
        for hf_name, g_name in [
            ("attention.self.query", "attention/self/query"),
            ("attention.self.key", "attention/self/key"),
            ("attention.self.value", "attention/self/value"),
            ("attention.output.dense", "attention/output/dense"),
            ("intermediate.dense", "intermediate/dense"),
            ("output.dense", "output/dense"),
        ]:
            g[f"{dst}{g_name}/kernel"] = hf[f"{src}{hf_name}.weight"].T
            g[f"{dst}{g_name}/bias"] = hf[f"{src}{hf_name}.bias"]
        for hf_name, g_name in [("attention.output.LayerNorm", "attention/output/LayerNorm"),
                                ("output.LayerNorm", "output/LayerNorm")]:
            g[f"{dst}{g_name}/gamma"] = hf[f"{src}{hf_name}.weight"]
            g[f"{dst}{g_name}/beta"] = hf[f"{src}{hf_name}.bias"]
    return g


def google_heads(config=HF_CONFIG, seed=1):
    rng = np.random.default_rng(seed)
    H, V = config["hidden_size"], config["vocab_size"]
    return {
        "cls/predictions/transform/dense/kernel": rng.normal(size=(H, H)),
        "cls/predictions/transform/dense/bias": rng.normal(size=(H,)),
        "cls/predictions/transform/LayerNorm/gamma": rng.normal(size=(H,)),
        "cls/predictions/transform/LayerNorm/beta": rng.normal(size=(H,)),
        "cls/predictions/output_bias": rng.normal(size=(V,)),
        "cls/seq_relationship/output_weights": rng.normal(size=(2, H)),
        "cls/seq_relationship/output_bias": rng.normal(size=(2,)),
    }


def write_google_checkpoint(directory, variables, config):
    """A TF1 name-based checkpoint written the way Google's BERT was (tf.compat.v1 Saver),
    plus its bert_config.json; returns (checkpoint_prefix, config_path)."""
    import tensorflow as tf

    os.makedirs(directory, exist_ok=True)
    prefix = os.path.join(directory, "bert_model.ckpt")
    graph = tf.Graph()
    with graph.as_default():
        tf_variables = [
            tf.compat.v1.get_variable(name, initializer=np.asarray(value, "float32"))
            for name, value in variables.items()
        ]
        saver = tf.compat.v1.train.Saver(tf_variables)
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            saver.save(session, prefix, write_meta_graph=False)
    google_config = {k: config[k] for k in (
        "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
        "intermediate_size", "hidden_act", "hidden_dropout_prob",
        "attention_probs_dropout_prob", "max_position_embeddings", "type_vocab_size")}
    google_config["initializer_range"] = 0.02
    config_path = os.path.join(directory, "bert_config.json")
    with open(config_path, "w") as f:
        json.dump(google_config, f)
    return prefix, config_path


def numpy_bert_from_hf(t, ids, segments, padding, config=HF_CONFIG, gelu="erf"):
    """transformers' BertModel forward, in float64 numpy, from the HF tensors."""
    H, heads = config["hidden_size"], config["num_attention_heads"]
    d, eps = H // heads, config["layer_norm_eps"]

    def ln(x, name):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * t[name + ".weight"] + t[name + ".bias"]

    def linear(x, name):
        return x @ t[name + ".weight"].T.astype("float64") + t[name + ".bias"]

    def act(x):
        if gelu == "erf":
            return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))

    B, T = ids.shape
    x = (t["embeddings.word_embeddings.weight"][ids]
         + t["embeddings.position_embeddings.weight"][np.arange(T)][None]
         + t["embeddings.token_type_embeddings.weight"][segments]).astype("float64")
    x = ln(x, "embeddings.LayerNorm")
    extended = (1.0 - padding[:, None, None, :]) * np.finfo("float64").min  # (B, 1, 1, T)
    for i in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{i}."

        def split(y):
            return y.reshape(B, T, heads, d).transpose(0, 2, 1, 3)  # (B, h, T, d)

        q, k, v = (split(linear(x, p + f"attention.self.{n}")) for n in ("query", "key", "value"))
        scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d) + extended
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        context = (probs @ v).transpose(0, 2, 1, 3).reshape(B, T, H)
        x = ln(linear(context, p + "attention.output.dense") + x, p + "attention.output.LayerNorm")
        h = act(linear(x, p + "intermediate.dense"))
        x = ln(linear(h, p + "output.dense") + x, p + "output.LayerNorm")
    pooled = np.tanh(linear(x[:, 0], "pooler.dense"))
    return x, pooled


def inputs():
    padding = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], "int32")
    return {
        "token_ids": np.array([[2, 5, 9, 3, 7, 1], [2, 11, 29, 3, 0, 0]], "int32"),
        "segment_ids": np.array([[0, 0, 0, 1, 1, 1], [0, 0, 1, 1, 0, 0]], "int32"),
        "padding_mask": padding,
    }


def outputs(model, x):
    out = model(x)
    return (ops.convert_to_numpy(out["sequence_output"]),
            ops.convert_to_numpy(out["pooled_output"]))


# === Hugging Face ===


@pytest.mark.parametrize("fused_qkv", [True, False])
@pytest.mark.parametrize("hidden_act, gelu", [("gelu", "erf"), ("gelu_new", "tanh")])
def test_hf_import_matches_numpy_bert(tmp_path, fused_qkv, hidden_act, gelu):
    config = {**HF_CONFIG, "hidden_act": hidden_act}
    tensors = hf_tensors(config)
    model = load_hf_bert(write_hf_checkpoint(tmp_path, tensors, config), fused_qkv=fused_qkv)
    assert model.fused_qkv == fused_qkv and model.layer_norm_epsilon == 1e-12
    x = inputs()
    sequence, pooled = outputs(model, x)
    ref_sequence, ref_pooled = numpy_bert_from_hf(
        tensors, x["token_ids"], x["segment_ids"], x["padding_mask"], config, gelu)
    np.testing.assert_allclose(sequence, ref_sequence, atol=2e-5)
    np.testing.assert_allclose(pooled, ref_pooled, atol=2e-5)


def test_hf_task_checkpoint_needs_explicit_skip(tmp_path):
    tensors = hf_tensors(prefix="bert.")
    tensors["cls.predictions.bias"] = np.zeros(30, "float32")
    tensors["cls.predictions.transform.dense.weight"] = np.zeros((8, 8), "float32")
    directory = write_hf_checkpoint(tmp_path, tensors)
    with pytest.raises(ValueError, match=r"2 checkpoint tensor\(s\) map to no weight.*"
                       r"cls\.predictions\.bias, cls\.predictions\.transform\.dense\.weight.*"
                       r"skip=\('cls\.',\)"):
        load_hf_bert(directory)
    model = load_hf_bert(directory, skip=("cls.",))
    plain = load_hf_bert(write_hf_checkpoint(tmp_path / "plain", hf_tensors()))
    for a, b in zip(outputs(model, inputs()), outputs(plain, inputs())):
        np.testing.assert_array_equal(a, b)


def test_hf_missing_and_unknown_tensors_are_listed(tmp_path):
    tensors = hf_tensors()
    del tensors["encoder.layer.1.output.dense.weight"]
    del tensors["embeddings.LayerNorm.bias"]
    tensors["encoder.layer.7.output.dense.bias"] = np.zeros(8, "float32")
    with pytest.raises(ValueError, match=(
            r"2 weight\(s\) the model needs are missing from the checkpoint: "
            r"embeddings\.LayerNorm\.bias, encoder\.layer\.1\.output\.dense\.weight.*"
            r"1 checkpoint tensor\(s\) map to no weight of the model: "
            r"encoder\.layer\.7\.output\.dense\.bias")):
        load_hf_bert(write_hf_checkpoint(tmp_path, tensors))


def test_hf_missing_pooler_is_an_error_unless_allowed(tmp_path):
    tensors = hf_tensors()
    del tensors["pooler.dense.weight"], tensors["pooler.dense.bias"]
    directory = write_hf_checkpoint(tmp_path, tensors)
    with pytest.raises(ValueError, match=r"pooler\.dense\.weight.*allow_missing=\('pooler',\)"):
        load_hf_bert(directory)
    model = load_hf_bert(directory, allow_missing=("pooler",))
    x = inputs()
    ref_sequence, _ = numpy_bert_from_hf(hf_tensors(), x["token_ids"], x["segment_ids"],
                                         x["padding_mask"])
    np.testing.assert_allclose(outputs(model, x)[0], ref_sequence, atol=2e-5)
    with pytest.raises(ValueError, match="allow_missing.*pooler.*Received: "
                       r"allow_missing=\('encoder',\)"):
        load_hf_bert(directory, allow_missing=("encoder",))


def test_hf_shape_mismatch_reports_file_layout(tmp_path):
    tensors = hf_tensors()
    tensors["encoder.layer.0.intermediate.dense.weight"] = np.zeros((15, 8), "float32")
    with pytest.raises(ValueError, match=(
            r"1 tensor\(s\) have the wrong shape: encoder\.layer\.0\.intermediate\.dense\."
            r"weight: checkpoint shape \(15, 8\), the config implies \(16, 8\)")):
        load_hf_bert(write_hf_checkpoint(tmp_path, tensors))


@pytest.mark.parametrize("change, match", [
    (dict(model_type="roberta"), "model_type.*Received: model_type='roberta'"),
    (dict(hidden_act="silu"), "hidden_act.*Received: hidden_act='silu'"),
    (dict(position_embedding_type="relative_key"), "relative position embeddings"),
    (dict(is_decoder=True), "decoder"),
    (dict(attention_probs_dropout_prob=0.2), "one dropout rate.*dropout="),
])
def test_hf_config_validation(tmp_path, change, match):
    config = {**HF_CONFIG, **change}
    with pytest.raises(ValueError, match=match):
        load_hf_bert(write_hf_checkpoint(tmp_path, hf_tensors(), config))


def test_hf_dropout_override_and_missing_size_field(tmp_path):
    config = {**HF_CONFIG, "attention_probs_dropout_prob": 0.2}
    model = load_hf_bert(write_hf_checkpoint(tmp_path, hf_tensors(), config), dropout=0.0)
    assert model.dropout == 0.0
    config = {k: v for k, v in HF_CONFIG.items() if k != "intermediate_size"}
    with pytest.raises(ValueError, match=r"lacks the size field\(s\) \['intermediate_size'\]"):
        load_hf_bert(write_hf_checkpoint(tmp_path / "b", hf_tensors(), config))


def test_hf_files_and_buffers_are_checked(tmp_path):
    with pytest.raises(ValueError, match="checkpoint directory.*Received: directory="):
        load_hf_bert(str(tmp_path / "nowhere"))
    directory = write_hf_checkpoint(tmp_path / "a", hf_tensors())
    os.remove(os.path.join(directory, "model.safetensors"))
    with pytest.raises(ValueError, match="No model.safetensors.*safe_serialization"):
        load_hf_bert(directory)
    tensors = hf_tensors()
    tensors["embeddings.position_ids"] = np.arange(12)[None, ::-1].copy()
    with pytest.raises(ValueError, match="embeddings.position_ids should hold the positions"):
        load_hf_bert(write_hf_checkpoint(tmp_path / "b", tensors))
    with pytest.raises(ValueError, match="31 entries.*vocab_size.*30"):
        load_hf_bert(write_hf_checkpoint(tmp_path / "c", hf_tensors(), vocab_lines=31))
    with pytest.raises(ValueError, match="skip.*tuple of non-empty name prefixes"):
        load_hf_bert(write_hf_checkpoint(tmp_path / "d", hf_tensors()), skip="cls.")


# === Google ===


def test_google_checkpoint_imports_like_hf(tmp_path):
    tensors = hf_tensors()
    prefix, config_path = write_google_checkpoint(
        tmp_path / "google", {**google_variables(tensors), **google_heads()}, HF_CONFIG)
    with pytest.raises(ValueError, match=(
            r"7 checkpoint tensor\(s\) map to no weight.*cls/predictions/output_bias.*"
            r"cls/seq_relationship/output_weights.*skip=\('cls/',\)")):
        load_google_bert(prefix, config_path)
    hf_model = load_hf_bert(write_hf_checkpoint(tmp_path / "hf", tensors))
    # Same weights, variable by variable.
    exact = load_google_bert(prefix, config_path, skip=("cls/",), activation="gelu")
    for a, b in zip(exact.weights, hf_model.weights):
        assert a.path == b.path
        np.testing.assert_array_equal(ops.convert_to_numpy(a), ops.convert_to_numpy(b))
    x = inputs()
    for a, b in zip(outputs(exact, x), outputs(hf_model, x)):
        np.testing.assert_array_equal(a, b)
    # By default "gelu" is Google's tanh approximation, as in its modeling.py.
    model = load_google_bert(prefix, config_path, skip=("cls/",), fused_qkv=False)
    assert model.activation == "gelu_approximate"
    ref_sequence, ref_pooled = numpy_bert_from_hf(
        tensors, x["token_ids"], x["segment_ids"], x["padding_mask"], gelu="tanh")
    np.testing.assert_allclose(outputs(model, x)[0], ref_sequence, atol=2e-5)
    np.testing.assert_allclose(outputs(model, x)[1], ref_pooled, atol=2e-5)


def test_google_errors(tmp_path):
    tensors = hf_tensors()
    variables = google_variables(tensors)
    variables["bert/encoder/layer_1/output/dense/kernel"] = np.zeros((16, 9))
    del variables["bert/pooler/dense/bias"]
    variables["global_step"] = np.zeros(())
    prefix, config_path = write_google_checkpoint(tmp_path, variables, HF_CONFIG)
    with pytest.raises(ValueError, match=(
            r"missing from the checkpoint: bert/pooler/dense/bias.*"
            r"map to no weight of the model: global_step.*"
            r"bert/encoder/layer_1/output/dense/kernel: checkpoint shape \(16, 9\), the "
            r"config implies \(16, 8\)")):
        load_google_bert(prefix, config_path)
    with pytest.raises(ValueError, match="Cannot read a TensorFlow checkpoint"):
        load_google_bert(str(tmp_path / "missing.ckpt"), config_path)
    with pytest.raises(ValueError, match="config_path"):
        load_google_bert(prefix, str(tmp_path / "nope.json"))
    with open(config_path, "w") as f:
        json.dump({**HF_CONFIG, "hidden_act": "swish"}, f)
    with pytest.raises(ValueError, match="hidden_act.*Received: hidden_act='swish'"):
        load_google_bert(prefix, config_path)
