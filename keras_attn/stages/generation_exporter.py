"""`keras-attn export RUN` for a language model run (task `causal_lm`, a `GPTCausalLM`): the
`.tflite` files that generate text, each checked against the Keras model, with a report.

    keras-attn export runs/shakespeare_char_none
    keras-attn predict runs/shakespeare_char_none/export "ROMEO:" --max-new-tokens 100

Files: one `decode_step` signature (`GPTCausalLM.decoder_step_model` of the model's
`max_sequence_length` positions: a token and the key/value cache in, the next token's logits
and the cache out; batch 1, builtin ops; `keras_attn.export.tflite.signature_tflite`), the card and
the vocabulary embedded (the file alone generates: `GenerationFile`):

- `generation_fp32.tflite`: the float model;
- `generation_dynamic_int8.tflite`: int8 weights, float activations;
- `generation_int8.tflite`: the int8 recipe's QAT layout (a float residual stream),
  calibrated post-training on the float step's inputs along training text; with a
  quantization-aware run of the model (`model.quantization_aware: true` continuing it, given
  as `qat_run`, or exported itself), the QAT model's trained weights and ranges
  (`copy_quantized_weights`) in its layout: only the cache input's range is calibrated.

Each file is scored on the evaluation split (`test`, else `dev`), its first blocks of
`max_sequence_length + 1` tokens read token by token through the file (teacher forcing):
perplexity (and bits per character for a character model) beside the Keras model's; and on
prompts (the first `PROMPT_TOKENS` tokens of each block, at most a quarter of the
positions) by greedy and by seeded top-k generation of `NEW_TOKENS` tokens (at most the
rest): the share of continuations equal to the Keras model's (the same
`keras_attn.generation` code), ms per generated token. The card's `default_file`
is the int8 file when its perplexity is within `INT8_PERPLEXITY_RATIO` of the model's.
"""

import json
import math
import pathlib
import time

import numpy as np
from keras import ops

from keras_attn import atomic_files
from keras_attn.errors import KerasAttnError
from keras_attn.export.tflite.generation_file import DECODE_STEP_SIGNATURE
from keras_attn.export.tflite.generation_file import GenerationFile
from keras_attn.export.tflite.signature_tflite import export_signatures_tflite
from keras_attn.export.tflite.tflite_metadata import append_associated_files
from keras_attn.machine import cpu_description
from keras_attn.models.gpt_causal_lm import GPTCausalLM
from keras_attn.quantization.calibration import calibrate_model
from keras_attn.quantization.model_queries import activation_quantizers
from keras_attn.quantization.model_queries import model_layout
from keras_attn.quantization.quantize_model import quantize_model
from keras_attn.quantization.quantized_weights import copy_quantized_weights
from keras_attn.runs.export_directory import CARD_FILE
from keras_attn.runs.export_directory import ExportDirectory
from keras_attn.runs.quantization_recipe import QuantizationRecipe
from keras_attn.runs.run_directory import RunDirectory
from keras_attn.runs.run_directory import qat_source_runs
from keras_attn.runs.task_head import max_sequence_length
from keras_attn.text_generation import GENERATION_TASK
from keras_attn.text_generation import TextGenerator
from keras_attn.training.tasks.causal_lm_task import read_character_text
from keras_attn.training.tasks.causal_lm_task import read_text_lines
from keras_attn.version import __version__

FILE_NAME = "generation_{}.tflite"
VARIANTS = ("fp32", "dynamic_int8", "int8")
INT8_PERPLEXITY_RATIO = 1.02  # the int8 file's perplexity / the model's, to be the default
EVAL_BLOCKS = 64  # blocks of the evaluation split read through each file
KERAS_ROWS = {"keras": "Keras model", "keras_qat": "Keras QAT model"}  # the report's rows
PROMPTS, PROMPT_TOKENS, NEW_TOKENS = 8, 16, 48
SAMPLING = {"sampler": "sample", "top_k": 10}  # the seeded check (seed = the prompt's index)
# The int8 step is calibrated on CALIBRATION_ROWS training blocks, teacher-forced, at every
# CALIBRATION_STRIDE-th position (each recorded step holds its own cache).
CALIBRATION_ROWS, CALIBRATION_STRIDE = 8, 4


class GenerationExportError(KerasAttnError, ValueError):
    """A run the language model export cannot take (the message says why)."""


def export_generation_run(run_dir, output_dir, eval_split="auto", max_eval_examples=None,
                          qat_run=None, log=None):
    """Exports a finished `causal_lm` run of a `GPTCausalLM` (module docstring).

    Args:
        run_dir: the run directory (`model.keras`, `config.json`, its vocabulary), or a
            quantization-aware run continuing one (then that float run is the source).
        output_dir: the export directory.
        eval_split: `"auto"` (test, else dev), `"dev"` or `"test"`.
        max_eval_examples: optional int, the blocks to score on (default `EVAL_BLOCKS`).
        qat_run: optional quantization-aware run of the model, whose weights and ranges
            the int8 file holds.
        log: callable receiving progress lines.

    Returns:
        The report dict (also written as `export_report.json` and `.md`).
    """
    log = log or (lambda message: None)
    run, qat = qat_source_runs(RunDirectory(run_dir), qat_run, GENERATION_TASK)
    generator = TextGenerator.from_run(run.path)
    model, codec = generator.model, generator.codec
    if not isinstance(model, GPTCausalLM):
        raise GenerationExportError(
            f"{run.path}: a {type(model).__name__} run; the generation files hold a "
            "GPTCausalLM's decoding step")
    qat_model = _qat_model(qat, model)
    config = run.config()
    split = run.evaluation_split(eval_split)
    length = generator.max_length
    blocks = _blocks(_token_stream(codec, config.data, getattr(config.data, split)), length,
                     max_eval_examples or EVAL_BLOCKS)
    log(f"source: {run.path} (GPTCausalLM, {model.count_params():,} parameters, "
        f"{codec.kind} vocabulary of {model.backbone.vocabulary_size:,}); {len(blocks)} "
        f"{split} blocks of {length + 1} tokens")
    prompt_tokens = min(PROMPT_TOKENS, max(1, length // 4))
    new_tokens = min(NEW_TOKENS, length - prompt_tokens)
    prompts = [block[:prompt_tokens] for block in blocks[:PROMPTS]]
    keras_row = {"artifact": "keras", **_perplexity(_keras_logits(model, blocks), blocks,
                                                    codec)}
    keras_row["generated"] = _continuations(generator, prompts, new_tokens)
    log(f"  Keras model: perplexity {keras_row['perplexity']:.4f}")
    qat_rows = []
    if qat_model is not None:
        qat_rows = [{"artifact": "keras_qat", **_perplexity(_keras_logits(qat_model, blocks),
                                                            blocks, codec)}]
        log(f"  Keras QAT model ({qat.path}): perplexity {qat_rows[0]['perplexity']:.4f}")
    card = _card(model, codec)
    output = pathlib.Path(output_dir)
    files = _write_files(model, codec, config, card, output, log, qat_model)
    rows = [keras_row] + qat_rows + [
        _file_row(variant, path, blocks, prompts, new_tokens, keras_row, log)
        for variant, path in files.items()]
    int8 = next(row for row in rows if row["artifact"] == "int8")
    card["default_file"] = FILE_NAME.format(
        "int8" if int8["perplexity"] <= keras_row["perplexity"] * INT8_PERPLEXITY_RATIO
        else "fp32")
    for row in rows:
        row.pop("generated", None)
    report = {"task": GENERATION_TASK, "metric": "perplexity", "source_run": str(run.path),
              "qat_run": str(qat.path) if qat is not None else None,
              "eval_split": split, "blocks": len(blocks), "prompts": len(prompts),
              "prompt_tokens": prompt_tokens, "new_tokens": new_tokens, "sampling": SAMPLING,
              "machine": cpu_description(), "keras_attn_version": __version__,
              "artifacts": rows, "default_file": card["default_file"]}
    export = ExportDirectory(output)
    export.write_card({**card, "artifacts": sorted(path.name for path in files.values())})
    atomic_files.write_bytes(output / codec.vocabulary_file, codec.vocabulary_bytes())
    export.write_report(report, report_markdown(report))
    return report


def _qat_model(qat, model):
    """The QAT run's model, checked to be a copy of `model` (the same vocabulary and
    positions), or `None` without a QAT run."""
    if qat is None:
        return None
    qat_model = qat.load_model()
    wanted = (model.backbone.vocabulary_size, model.backbone.max_sequence_length)
    found = (qat_model.output.shape[-1], max_sequence_length(qat_model))
    if not activation_quantizers(qat_model) or found != wanted:
        raise GenerationExportError(
            f"--qat-run {qat.path}: not the quantization-aware copy of {model.name} "
            f"(vocabulary and positions {found}, the float model's {wanted})")
    return qat_model


def _token_stream(codec, data, path):
    """The ids of the text at `path` as the task reads it: a character model the whole
    text, WordPiece every non-blank line followed by the end-of-text token."""
    if codec.kind != "wordpiece":
        return codec.encode(read_character_text(path))
    end = list(codec.stop_token_ids)
    return np.array([i for line in read_text_lines(path) for i in
                     codec.encode(line).tolist() + end], "int32")


def _blocks(stream, length, count):
    """Up to `count` blocks of `length + 1` ids (inputs and their next tokens)."""
    blocks = [stream[start:start + length + 1]
              for start in range(0, len(stream) - length, length)][:count]
    if not blocks:
        raise GenerationExportError(f"the evaluation text holds {len(stream)} tokens, fewer "
                                    f"than one block of {length + 1}")
    return blocks


def _keras_logits(model, blocks):
    """The model's `(T, V)` logits of each block's inputs."""
    inputs = np.stack([block[:-1] for block in blocks])
    logits = model({"token_ids": inputs, "padding_mask": np.ones_like(inputs)})
    return list(ops.convert_to_numpy(logits).astype("float64"))


def _perplexity(logits, blocks, codec):
    """`{"perplexity", "loss"}` (mean next-token NLL, nats) and, for characters,
    `"bits_per_character"`."""
    total, count = 0.0, 0
    for block_logits, block in zip(logits, blocks):
        log_probs = block_logits - np.logaddexp.reduce(block_logits, axis=-1, keepdims=True)
        total -= float(log_probs[np.arange(len(block) - 1), block[1:]].sum())
        count += len(block) - 1
    loss = total / count
    scores = {"perplexity": math.exp(loss), "loss": loss}
    if codec.kind != "wordpiece":
        scores["bits_per_character"] = loss / math.log(2)
    return scores


def _continuations(generator, prompts, new_tokens):
    """`{"greedy": [...], "sampled": [...]}`: the new ids after each prompt, and the
    seconds they took."""
    started = time.perf_counter()
    greedy = [generator.generate_ids(p, new_tokens) for p in prompts]
    sampled = [generator.generate_ids(p, new_tokens, **SAMPLING, seed=i)
               for i, p in enumerate(prompts)]
    return {"greedy": greedy, "sampled": sampled, "seconds": time.perf_counter() - started,
            "tokens": sum(len(ids) for ids in greedy + sampled)}


def _card(model, codec):
    """The card embedded in every file: what a runtime needs to tokenize, decode and
    detokenize."""
    backbone = model.backbone
    return {"task": GENERATION_TASK, "model": type(model).__name__,
            "max_length": backbone.max_sequence_length, "tokenizer": codec.kind,
            "lowercase": getattr(codec.tokenizer, "lowercase", False),
            "vocabulary_file": codec.vocabulary_file,
            "vocabulary_size": backbone.vocabulary_size,
            "stop_token_ids": list(codec.stop_token_ids), "pad_token_id": 0,
            "signatures": {"decode_step": DECODE_STEP_SIGNATURE},
            "keras_attn_version": __version__}


def _write_files(model, codec, config, card, output, log, qat_model):
    """`{variant: path}` of the three files, written with the card and vocabulary."""
    step = model.decoder_step_model(card["max_length"])
    files = {}
    for variant in VARIANTS:
        graph = step if variant != "int8" else _int8_step(step, codec, config, log, qat_model)
        path = output / FILE_NAME.format(variant)
        started = time.perf_counter()
        export_signatures_tflite({"step": graph},
                                 {DECODE_STEP_SIGNATURE: ("step", None, 1)}, path, variant)
        atomic_files.write_bytes(path, append_associated_files(path.read_bytes(), {
            CARD_FILE: (json.dumps(card, indent=1, ensure_ascii=False) + "\n").encode("utf-8"),
            codec.vocabulary_file: codec.vocabulary_bytes()}))
        log(f"  wrote {path} ({time.perf_counter() - started:.0f} s)")
        files[variant] = path
    return files


def _int8_step(step, codec, config, log, qat_model):
    """The step's `quantize_model` copy in the int8 recipe's layout (the QAT model's),
    calibrated on its inputs along `CALIBRATION_ROWS` training blocks read token by token;
    then holding the QAT model's weights and ranges where it has the layer."""
    length = step.input["cache"].shape[3]
    blocks = _blocks(_token_stream(codec, config.data, config.data.train), length,
                     CALIBRATION_ROWS)
    tokens = np.stack([block[:-1] for block in blocks])  # (R, M)
    cache = np.zeros((len(tokens), *step.input["cache"].shape[1:]), "float32")
    recorded = []
    for index in range(length):
        inputs = {"token_ids": tokens[:, index:index + 1],
                  "cache_update_index": np.full((len(tokens),), index, "int32"),
                  "cache": cache}
        if index % CALIBRATION_STRIDE == 0:
            recorded.append(inputs)
        cache = ops.convert_to_numpy(step(inputs)["cache"])
    layout = QuantizationRecipe().layout() if qat_model is None else model_layout(qat_model)
    int8 = quantize_model(step, **layout)
    calibrate_model(int8, recorded)
    log(f"  int8: calibrated on {len(recorded)} steps of {len(tokens)} training blocks")
    if qat_model is not None:
        calibrated = copy_quantized_weights(qat_model, int8)
        log(f"  int8: the QAT model's weights and ranges; calibrated only: "
            f"{', '.join(calibrated) or 'none'}")
    return int8


def _file_row(variant, path, blocks, prompts, new_tokens, keras_row, log):
    """The report row of one file, run on 1 thread."""
    runtime = GenerationFile(path, num_threads=1)
    generator = TextGenerator(runtime, runtime.codec, runtime.max_length)
    row = {"artifact": variant, "file": path.name, "size_bytes": path.stat().st_size,
           **_perplexity([runtime.sequence_logits(b[:-1]) for b in blocks], blocks,
                         runtime.codec)}
    generated = _continuations(generator, prompts, new_tokens)
    for kind in ("greedy", "sampled"):
        pairs = list(zip(generated[kind], keras_row["generated"][kind]))
        row[f"same_as_keras_{kind}"] = float(np.mean([a == b for a, b in pairs]))
        # The tokens before the first that differs, a share of all: how long they agree.
        row[f"prefix_as_keras_{kind}"] = sum(_common_prefix(a, b) for a, b in pairs) / max(
            sum(len(b) for _, b in pairs), 1)
    row["ms_per_token"] = 1000 * generated["seconds"] / max(generated["tokens"], 1)
    row["generated"] = generated
    log(f"  {path.name}: perplexity {row['perplexity']:.4f}, greedy "
        f"{100 * row['same_as_keras_greedy']:.0f} % / top-k "
        f"{100 * row['same_as_keras_sampled']:.0f} % as Keras, "
        f"{row['size_bytes'] / 1e6:.2f} MB, {row['ms_per_token']:.2f} ms per token")
    return row


def _common_prefix(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def report_markdown(report):
    """The report as a Markdown page."""
    bits = "bits_per_character" in report["artifacts"][0]
    lines = [f"# Language model export of {report['source_run']}", "",
             f"Perplexity on {report['blocks']} {report['eval_split']} blocks, read token by "
             f"token through each file; generation: {report['prompts']} prompts of "
             f"{report['prompt_tokens']} tokens, {report['new_tokens']} new tokens greedy and "
             f"top-{report['sampling']['top_k']} sampled (seed = the prompt's index): the "
             "share of continuations equal to the Keras model's (and of the tokens before "
             "the first that differs); latency on "
             f"{report['machine']}, 1 thread, the whole generation in Python.", "",
             "| artifact | perplexity |" + (" bits / char |" if bits else "")
             + " greedy as Keras | top-k as Keras | size | ms / token |",
             "| --- | --- |" + (" --- |" if bits else "") + " --- | --- | --- | --- |"]
    for row in report["artifacts"]:
        cells = [f"`{row['file']}`" if "file" in row else KERAS_ROWS[row["artifact"]],
                 f"{row['perplexity']:.4f}"]
        if bits:
            cells.append(f"{row['bits_per_character']:.4f}")
        if "file" in row:
            cells += [f"{100 * row['same_as_keras_greedy']:.0f} % "
                      f"({100 * row['prefix_as_keras_greedy']:.0f} %)",
                      f"{100 * row['same_as_keras_sampled']:.0f} % "
                      f"({100 * row['prefix_as_keras_sampled']:.0f} %)",
                      f"{row['size_bytes'] / 1e6:.2f} MB", f"{row['ms_per_token']:.2f}"]
        else:
            cells += ["", "", "", ""]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"`keras-attn predict EXPORT_DIR` uses `{report['default_file']}`."]
    return "\n".join(lines) + "\n"
