"""`keras-attn export RUN` for a translation run (task `seq2seq`, a `Seq2SeqTransformer`): the
translation `.tflite` files, each scored by sacreBLEU against the Keras model, with a report.

    keras-attn export runs/multi30k_transformer
    keras-attn predict runs/multi30k_transformer/export --input test.de --beams 4

Files (`keras_attn.export.translation_tflite`: `encode_{S}` and `decode_step_{S}` signatures
per source length bucket, batch 1, builtin ops; the vocabulary and the card embedded, so the
file alone translates):

- `translation_fp32.tflite`: the float model;
- `translation_dynamic_int8.tflite`: int8 weights, float activations (the converter's
  dynamic-range quantization);
- `translation_int8.tflite`: the QAT layout of the int8 recipe (`QuantizationRecipe()`, a
  float residual stream) on both graphs, calibrated (post-training, no QAT run yet): the
  encoder on training sources, the decoding step on the float model's greedy decoding of
  them;
- `translation_encoder.onnx` + `translation_decoder_step.onnx` and their `_dynamic_int8`
  versions (`keras_attn.export.translation_onnx_export`): the encoder + decoder-with-past
  pair of the transformers.js route, for onnxruntime(-web).

Each file translates the evaluation split (`test`, else `dev`) with the run's decoding
settings (`train.eval_num_beams`, `train.eval_length_penalty`) through
`Translator(TranslationFile(...))`, the same beam search as the Keras model; the report
(`export_report.json` / `.md`) gives per file sacreBLEU, the share of sentences translated
exactly as Keras does, size, and ms per sentence and per generated token (1 thread, the
whole evaluation split). The card's `default_file` (what `keras-attn predict EXPORT_DIR`
uses) is the int8 file when its BLEU is within `INT8_BLEU_BUDGET` of the Keras model's, else
the fp32 file.
"""

import json
import pathlib
import time

import numpy as np
import sacrebleu
from keras import ops

from keras_attn import atomic_files
from keras_attn.errors import KerasAttnError
from keras_attn.export.tflite_export import bucket_lengths
from keras_attn.export.tflite_metadata import append_associated_files
from keras_attn.export.translation_onnx_export import export_translation_onnx
from keras_attn.export.translation_tflite import export_translation_tflite
from keras_attn.export.translation_tflite import translation_graphs
from keras_attn.inference.translation_file import TranslationFile
from keras_attn.inference.translation_file import runtime_translator
from keras_attn.inference.translation_onnx import TranslationOnnx
from keras_attn.inference.translation_onnx import step_path
from keras_attn.machine import cpu_description
from keras_attn.models.seq2seq_transformer import Seq2SeqTransformer
from keras_attn.quantization.quantization_recipe import QuantizationRecipe
from keras_attn.quantization.quantize_model import calibrate_model
from keras_attn.quantization.quantize_model import quantize_model
from keras_attn.runs.export_directory import CARD_FILE
from keras_attn.runs.export_directory import VOCAB_FILE
from keras_attn.runs.export_directory import ExportDirectory
from keras_attn.runs.run_directory import RunDirectory
from keras_attn.text.labelled_examples import calibration_sample
from keras_attn.training.tasks.seq2seq_task import read_split_pairs
from keras_attn.translation import TRANSLATION_TASK
from keras_attn.translation import Translator
from keras_attn.version import __version__

# sacreBLEU's default corpus BLEU (13a, cased), what the seq2seq task reports.
SACREBLEU = sacrebleu.metrics.BLEU()
INT8_BLEU_BUDGET = 1.0  # BLEU points the int8 file may lose and still be the default
CALIBRATION_SOURCES = 256
CALIBRATION_BATCH = 32
# The decoding step is calibrated on the first STEP_ROWS rows of each batch at every
# STEP_STRIDE-th position: each recorded step holds its own self-attention cache (at
# Multi30k's size 0.4 MB a row), all 32 rows at every position took 6.4 GB.
STEP_ROWS, STEP_STRIDE = 8, 2
FILE_NAME = "translation_{}.tflite"


def export_translation_run(run_dir, output_dir, eval_split="auto", max_eval_examples=None,
                           log=None):
    """Exports a finished `seq2seq` run of a `Seq2SeqTransformer` (module docstring).

    Args:
        run_dir: the run directory (`model.keras`, `config.json`, `vocab.txt`).
        output_dir: the export directory.
        eval_split: `"auto"` (test, else dev), `"dev"` or `"test"`.
        max_eval_examples: optional int, translate only the first N pairs.
        log: callable receiving progress lines.

    Returns:
        The report dict (also written as `export_report.json` and `.md`).
    """
    log = log or (lambda message: None)
    run = RunDirectory(run_dir)
    translator = Translator.from_run(run.path)
    if not isinstance(translator.model, Seq2SeqTransformer):
        raise TranslationExportError(
            f"{run.path}: a {type(translator.model).__name__} run; the translation files "
            "hold a Seq2SeqTransformer's encoder and decoding step (an attention RNN's "
            "recurrent decoding step has no export yet): translate it with `keras-attn "
            "predict RUN`")
    config = run.config()
    split = run.evaluation_split(eval_split)
    pairs = read_split_pairs(config.data, getattr(config.data, split), log)[:max_eval_examples]
    sources = translator.source_ids([p.source for p in pairs])
    references = [p.target for p in pairs]
    log(f"source: {run.path} ({type(translator.model).__name__}, "
        f"{translator.model.count_params():,} parameters); {len(pairs):,} {split} pairs, "
        f"{translator.num_beams} beams")
    keras_row, keras_texts = _score("keras", translator, sources, references, None, None)
    log(f"  Keras model: BLEU {keras_row['bleu']:.2f}")
    output = pathlib.Path(output_dir)
    card = _card(config, translator, bucket_lengths(config.data.max_length))
    vocabulary = run.file(VOCAB_FILE).read_text(encoding="utf-8").splitlines()
    files = _write_files(translator, vocabulary, config, card, output, log)
    rows = [keras_row] + _file_rows(files, sources, references, keras_texts, log)
    int8 = next(r for r in rows if r["artifact"] == "int8")
    card["default_file"] = FILE_NAME.format(
        "int8" if int8["bleu"] >= keras_row["bleu"] - INT8_BLEU_BUDGET else "fp32")
    report = {"task": TRANSLATION_TASK, "metric": "bleu", "source_run": str(run.path),
              "eval_split": split, "examples": len(pairs), "num_beams": translator.num_beams,
              "machine": cpu_description(), "keras_attn_version": __version__,
              "bleu_signature": str(SACREBLEU.get_signature()), "artifacts": rows,
              "default_file": card["default_file"]}
    export = ExportDirectory(output)
    export.write_card({**card, "artifacts": sorted(
        name for path in files.values() for name in _file_names(path))})
    atomic_files.write_text(output / VOCAB_FILE, "\n".join(vocabulary) + "\n")
    export.write_report(report, report_markdown(report))
    return report


class TranslationExportError(KerasAttnError, ValueError):
    """A run the translation export cannot take (the message says why)."""


def _card(config, translator, source_lengths):
    """The card embedded in every file: what a runtime needs to tokenize, decode and
    detokenize."""
    tokenizer = translator.pieces.tokenizer
    return {"task": TRANSLATION_TASK, "model": type(translator.model).__name__,
            "max_length": config.data.max_length,
            "target_max_length": config.data.target_max_length,
            "source_lengths": list(source_lengths), "lowercase": translator.pieces.tokenizer
            .lowercase, "num_beams": translator.num_beams,
            "length_penalty": translator.length_penalty,
            "bos_token_id": tokenizer.cls_token_id, "eos_token_id": tokenizer.sep_token_id,
            "pad_token_id": tokenizer.pad_token_id, "joiner_token": "[JOIN]",
            "signatures": {"encode": "encode_{S}", "decode_step": "decode_step_{S}",
                           "beams_step": "decode_step_{S}_beams_{K}"},
            "keras_attn_version": __version__}


def _file_names(path):
    """The file names of an artifact: a `.tflite` file, or an ONNX encoder and its step."""
    return [path.name] + ([step_path(path).name] if path.suffix == ".onnx" else [])


def _write_files(translator, vocabulary, config, card, output, log):
    """`{variant: path}` of the three `.tflite` files, written with the card and vocabulary,
    and of the ONNX pairs (their encoder files)."""
    max_length = 1 + config.data.target_max_length  # BOS + generated tokens
    encoder, step = translation_graphs(translator.model, max_length)
    lengths = card["source_lengths"]
    files = {}
    for variant in ("fp32", "dynamic_int8", "int8"):
        graphs = (encoder, step) if variant != "int8" else _calibrated_int8(
            encoder, step, translator, config, max_length, log)
        path = output / FILE_NAME.format(variant)
        started = time.perf_counter()
        export_translation_tflite(*graphs, path, lengths, variant, beams=card["num_beams"])
        content = append_associated_files(path.read_bytes(), {
            CARD_FILE: (json.dumps(card, indent=1, ensure_ascii=False) + "\n").encode("utf-8"),
            VOCAB_FILE: ("\n".join(vocabulary) + "\n").encode("utf-8")})
        atomic_files.write_bytes(path, content)
        log(f"  wrote {path} ({time.perf_counter() - started:.0f} s)")
        files[variant] = path
    files.update(export_translation_onnx(encoder, step, output, card, vocabulary))
    log(f"  wrote the ONNX encoder and decoder-step pairs: {', '.join(files)}")
    return files


def _calibrated_int8(encoder, step, translator, config, max_length, log):
    """The `quantize_model` copies of the two graphs in the int8 recipe's layout, calibrated:
    the encoder on `CALIBRATION_SOURCES` training sources, the step on the inputs of the
    float graphs' greedy decoding of them."""
    layout = QuantizationRecipe().layout()
    pairs = calibration_sample(read_split_pairs(config.data, config.data.train),
                               CALIBRATION_SOURCES)
    sources = translator.source_ids([p.source for p in pairs])
    batches = [_padded(sources[i:i + CALIBRATION_BATCH], translator.pad_token_id)
               for i in range(0, len(sources), CALIBRATION_BATCH)]
    step_inputs = [inputs for batch in batches for inputs in _greedy_step_inputs(
        encoder, step, batch, max_length, translator)]
    int8_encoder, int8_step = quantize_model(encoder, **layout), quantize_model(step, **layout)
    calibrate_model(int8_encoder, batches)
    calibrate_model(int8_step, step_inputs)
    log(f"  int8: calibrated on {len(sources)} training sources and "
        f"{len(step_inputs)} decoding steps")
    return int8_encoder, int8_step


def _padded(sources, pad_token_id):
    length = max(len(s) for s in sources)
    ids = np.full((len(sources), length), pad_token_id, "int32")
    for row, source in enumerate(sources):
        ids[row, :len(source)] = source
    return {"encoder_token_ids": ids,
            "encoder_padding_mask": (ids != pad_token_id).astype("int32")}


def _greedy_step_inputs(encoder, step, batch, max_length, translator):
    """The decoding step's inputs (`STEP_ROWS` rows, every `STEP_STRIDE`-th position, copies)
    during the float graphs' greedy decoding of `batch` (until every row has ended)."""
    cross = ops.convert_to_numpy(encoder(batch)["cross_attention_cache"])
    rows = len(cross)
    cache = np.zeros((rows, *step.input["self_attention_cache"].shape[1:]), "float32")
    token = np.full((rows, 1), translator.bos_token_id, "int32")
    done = np.zeros(rows, bool)
    recorded, kept_cross = [], cross[:STEP_ROWS].copy()
    for index in range(max_length):
        inputs = {"decoder_token_ids": token,
                  "cache_update_index": np.full((rows,), index, "int32"),
                  "self_attention_cache": cache, "cross_attention_cache": cross,
                  "encoder_padding_mask": batch["encoder_padding_mask"]}
        if index % STEP_STRIDE == 0:
            recorded.append({name: value[:STEP_ROWS].copy() if name != "cross_attention_cache"
                             else kept_cross for name, value in inputs.items()})
        outputs = step(inputs)
        cache = ops.convert_to_numpy(outputs["self_attention_cache"])
        token = ops.convert_to_numpy(outputs["logits"]).argmax(-1)[:, None].astype("int32")
        done |= token[:, 0] == translator.eos_token_id
        if done.all():
            break
    return recorded


def _file_rows(files, sources, references, keras_texts, log):
    """The report row of each file (`{variant: path}`), translating on 1 thread."""
    rows = []
    for variant, path in files.items():
        runtime = (TranslationOnnx if path.suffix == ".onnx" else TranslationFile)(
            path, num_threads=1)
        row, _ = _score(variant, runtime_translator(runtime), sources, references, path,
                        keras_texts)
        rows.append(row)
        log(f"  {path.name}: BLEU {row['bleu']:.2f}, {100 * row['same_as_keras']:.1f} % "
            f"as Keras, {row['size_bytes'] / 1e6:.2f} MB, {row['ms_per_sentence']:.1f} ms "
            "per sentence")
    return rows


def _score(artifact, translator, sources, references, path, keras_texts):
    """The report row of one translator on the evaluation sources, and its texts."""
    translator.generated_tokens = 0
    texts, seconds = translator.translate_ids(sources, batch_size=1 if path else 64)
    row = {"artifact": artifact, "bleu": SACREBLEU.corpus_score(texts, [references]).score,
           "sentences": len(texts), "generated_tokens": translator.generated_tokens}
    if path is not None:
        row.update({
            "file": " + ".join(_file_names(path)), "size_bytes": sum(
                (path.parent / name).stat().st_size for name in _file_names(path)),
            "same_as_keras": float(np.mean([a == b for a, b in zip(texts, keras_texts)])),
            "ms_per_sentence": 1000 * seconds / max(len(texts), 1),
            "ms_per_token": 1000 * seconds / max(translator.generated_tokens, 1)})
    return row, texts


def report_markdown(report):
    """The report as a Markdown page."""
    lines = [f"# Translation export of {report['source_run']}", "",
             f"{report['examples']:,} {report['eval_split']} pairs, {report['num_beams']} "
             f"beams; sacreBLEU {report['bleu_signature']}; latency on {report['machine']}, "
             "1 thread, the whole split, one sentence at a time.", "",
             "| artifact | BLEU | same as Keras | size | ms / sentence | ms / token |",
             "| --- | --- | --- | --- | --- | --- |"]
    for row in report["artifacts"]:
        if "file" not in row:
            lines.append(f"| Keras model | {row['bleu']:.2f} | | | | |")
            continue
        lines.append(f"| `{row['file']}` | {row['bleu']:.2f} | "
                     f"{100 * row['same_as_keras']:.1f} % | {row['size_bytes'] / 1e6:.2f} MB | "
                     f"{row['ms_per_sentence']:.1f} | {row['ms_per_token']:.2f} |")
    lines += ["", f"`keras-attn predict EXPORT_DIR` uses `{report['default_file']}`."]
    return "\n".join(lines) + "\n"
