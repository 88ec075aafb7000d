"""`keras-attn export RUN` for a translation run (task `seq2seq`, a `Seq2SeqTransformer`): the
translation `.tflite` files, each scored by sacreBLEU against the Keras model, with a report.

    keras-attn export runs/multi30k_transformer
    keras-attn predict runs/multi30k_transformer/export --input test.de --beams 4

Files (`keras_attn.export.tflite.translation_tflite`: `encode_{S}` and `decode_step_{S}` signatures
per source length bucket, batch 1, builtin ops; the vocabulary and the card embedded, so the
file alone translates):

- `translation_fp32.tflite`: the float model;
- `translation_dynamic_int8.tflite`: int8 weights, float activations (the converter's
  dynamic-range quantization);
- `translation_int8.tflite`: the QAT layout of the int8 recipe (`QuantizationRecipe()`, a
  float residual stream) on both graphs, calibrated post-training: the encoder on training
  sources, the decoding step on the float model's greedy decoding of them
  (`calibrated_translation_graphs`); with a quantization-aware run of the model
  (`model.quantization_aware: true` continuing it, given as `qat_run`, or exported itself),
  in its layout and holding its trained weights and ranges (`copy_qat_weights`): only the
  decoding step's two cache inputs keep calibrated ranges;
- `translation_encoder.onnx` + `translation_decoder_step.onnx` and their `_dynamic_int8`
  versions (`keras_attn.export.onnx.translation_onnx_export`): the encoder + decoder-with-past
  pair of the transformers.js route, for onnxruntime(-web).

Each file translates the evaluation split (`test`, else `dev`) with the run's decoding
settings (`train.eval_num_beams`, `train.eval_length_penalty`) through
`Translator(TranslationFile(...))`, the same beam search as the Keras model; the report
(`export_report.json` / `.md`) gives per file sacreBLEU (and the QAT model's, decoded
through its graphs: `QATTranslation`), the share of sentences translated exactly as Keras
does, size, and ms per sentence and per generated token (1 thread, the whole evaluation
split). The card's `default_file` (what `keras-attn predict EXPORT_DIR`
uses) is the int8 file when its BLEU is within `INT8_BLEU_BUDGET` of the Keras model's, else
the fp32 file.
"""

import json
import pathlib
import time

import numpy as np
import sacrebleu

from keras_attn import atomic_files
from keras_attn.errors import KerasAttnError
from keras_attn.export.onnx.translation_onnx import TranslationOnnx
from keras_attn.export.onnx.translation_onnx import step_path
from keras_attn.export.onnx.translation_onnx_export import export_translation_onnx
from keras_attn.export.tflite.tflite_export import bucket_lengths
from keras_attn.export.tflite.tflite_metadata import append_associated_files
from keras_attn.export.tflite.translation_file import TranslationFile
from keras_attn.export.tflite.translation_file import runtime_translator
from keras_attn.export.tflite.translation_tflite import export_translation_tflite
from keras_attn.export.tflite.translation_tflite import translation_graphs
from keras_attn.machine import cpu_description
from keras_attn.models.seq2seq_transformer import Seq2SeqTransformer
from keras_attn.quantization.model_queries import activation_quantizers
from keras_attn.quantization.model_queries import model_layout
from keras_attn.runs.export_directory import CARD_FILE
from keras_attn.runs.export_directory import VOCAB_FILE
from keras_attn.runs.export_directory import ExportDirectory
from keras_attn.runs.quantization_recipe import QuantizationRecipe
from keras_attn.runs.run_directory import RunDirectory
from keras_attn.runs.run_directory import qat_source_runs
from keras_attn.text.labelled_examples import calibration_sample
from keras_attn.training.tasks.seq2seq_task import read_split_pairs
from keras_attn.translation import TRANSLATION_TASK
from keras_attn.translation import Translator
from keras_attn.translation_qat import CALIBRATION_SOURCES
from keras_attn.translation_qat import QATTranslation
from keras_attn.translation_qat import calibrated_translation_graphs
from keras_attn.version import __version__

# sacreBLEU's default corpus BLEU (13a, cased), what the seq2seq task reports.
SACREBLEU = sacrebleu.metrics.BLEU()
INT8_BLEU_BUDGET = 1.0  # BLEU points the int8 file may lose and still be the default
FILE_NAME = "translation_{}.tflite"
KERAS_ROWS = {"keras": "Keras model", "keras_qat": "Keras QAT model"}  # the report's rows


def export_translation_run(run_dir, output_dir, eval_split="auto", max_eval_examples=None,
                           qat_run=None, log=None):
    """Exports a finished `seq2seq` run of a `Seq2SeqTransformer` (module docstring).

    Args:
        run_dir: the run directory (`model.keras`, `config.json`, `vocab.txt`), or a
            quantization-aware run continuing one (then that float run is the source).
        output_dir: the export directory.
        eval_split: `"auto"` (test, else dev), `"dev"` or `"test"`.
        max_eval_examples: optional int, translate only the first N pairs.
        qat_run: optional quantization-aware run of the model, whose weights and ranges
            the int8 file holds.
        log: callable receiving progress lines.

    Returns:
        The report dict (also written as `export_report.json` and `.md`).

    Example:
    >>> export_translation_run("runs/m30k", "runs/m30k/export",
    ...                        qat_run="runs/m30k_qat")  # doctest: +SKIP
    """
    log = log or (lambda message: None)
    run, qat = qat_source_runs(RunDirectory(run_dir), qat_run, TRANSLATION_TASK)
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
    max_length = 1 + config.data.target_max_length  # BOS + generated tokens
    graphs = translation_graphs(translator.model, max_length)
    int8_graphs, qat_rows = _int8_graphs(graphs, translator, config, qat, sources,
                                         references, log)
    output = pathlib.Path(output_dir)
    card = _card(config, translator, bucket_lengths(config.data.max_length))
    vocabulary = run.file(VOCAB_FILE).read_text(encoding="utf-8").splitlines()
    files = _write_files(graphs, int8_graphs, vocabulary, card, output, log)
    rows = [keras_row] + qat_rows + _file_rows(files, sources, references, keras_texts, log)
    int8 = next(r for r in rows if r["artifact"] == "int8")
    card["default_file"] = FILE_NAME.format(
        "int8" if int8["bleu"] >= keras_row["bleu"] - INT8_BLEU_BUDGET else "fp32")
    report = {"task": TRANSLATION_TASK, "metric": "bleu", "source_run": str(run.path),
              "qat_run": str(qat.path) if qat is not None else None,
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


def _int8_graphs(graphs, translator, config, qat, sources, references, log):
    """`((int8 encoder, int8 step), QAT rows)`: the float graphs' `quantize_model` copies,
    calibrated on `CALIBRATION_SOURCES` training sources, in the int8 recipe's layout, or
    with a QAT run in its model's layout and holding its weights and ranges
    (`QATTranslation`); then the report row of that QAT model's translations."""
    qat_model = None if qat is None else _qat_model(qat, translator.model)
    layout = QuantizationRecipe().layout() if qat is None else model_layout(qat_model)
    pairs = calibration_sample(read_split_pairs(config.data, config.data.train),
                               CALIBRATION_SOURCES)
    tokenizer = translator.pieces.tokenizer
    encoder, step, steps = calibrated_translation_graphs(
        *graphs, translator.source_ids([p.source for p in pairs]), tokenizer, layout)
    log(f"  int8: calibrated on {len(pairs)} training sources and {steps} decoding steps")
    if qat is None:
        return (encoder, step), []
    runtime = QATTranslation(qat_model, None, None, tokenizer, None, graphs=(encoder, step))
    log(f"  int8: the QAT model's weights and ranges; calibrated only: "
        f"{', '.join(runtime.calibrated_only)}")
    row, _ = _score("keras_qat", Translator(
        runtime, translator.pieces, translator.max_length, translator.max_new_tokens,
        translator.num_beams, translator.length_penalty), sources, references, None, None)
    log(f"  Keras QAT model ({qat.path}): BLEU {row['bleu']:.2f}")
    return (encoder, step), [row]


def _qat_model(qat, model):
    """The QAT run's model, checked to be a copy of the float `model` (its vocabulary)."""
    qat_model = qat.load_model()
    rows = qat_model.output.shape[-1]  # (B, T, V) logits
    if not activation_quantizers(qat_model) or rows != model.vocabulary_size:
        raise TranslationExportError(
            f"--qat-run {qat.path}: not the quantization-aware copy of {model.name} "
            f"({rows} vocabulary rows, the float model's {model.vocabulary_size})")
    return qat_model


def _write_files(graphs, int8_graphs, vocabulary, card, output, log):
    """`{variant: path}` of the three `.tflite` files (the float `graphs`, `int8_graphs`
    for `int8`), written with the card and vocabulary, and of the ONNX pairs (their
    encoder files)."""
    lengths = card["source_lengths"]
    files = {}
    for variant in ("fp32", "dynamic_int8", "int8"):
        path = output / FILE_NAME.format(variant)
        started = time.perf_counter()
        export_translation_tflite(*(int8_graphs if variant == "int8" else graphs), path,
                                  lengths, variant, beams=card["num_beams"])
        content = append_associated_files(path.read_bytes(), {
            CARD_FILE: (json.dumps(card, indent=1, ensure_ascii=False) + "\n").encode("utf-8"),
            VOCAB_FILE: ("\n".join(vocabulary) + "\n").encode("utf-8")})
        atomic_files.write_bytes(path, content)
        log(f"  wrote {path} ({time.perf_counter() - started:.0f} s)")
        files[variant] = path
    files.update(export_translation_onnx(*graphs, output, card, vocabulary))
    log(f"  wrote the ONNX encoder and decoder-step pairs: {', '.join(files)}")
    return files


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
            lines.append(f"| {KERAS_ROWS[row['artifact']]} | {row['bleu']:.2f} | | | | |")
            continue
        lines.append(f"| `{row['file']}` | {row['bleu']:.2f} | "
                     f"{100 * row['same_as_keras']:.1f} % | {row['size_bytes'] / 1e6:.2f} MB | "
                     f"{row['ms_per_sentence']:.1f} | {row['ms_per_token']:.2f} |")
    lines += ["", f"`keras-attn predict EXPORT_DIR` uses `{report['default_file']}`."]
    return "\n".join(lines) + "\n"
