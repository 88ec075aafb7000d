"""`keras-attn export` and `keras-attn predict` on language models: a `causal_lm` run, its
export directory, or one of its `generation_*.tflite` files (`generation_command`).

    keras-attn export runs/shakespeare_char_none
    keras-attn predict runs/shakespeare_char_none/export "ROMEO:" --max-new-tokens 200
    keras-attn predict generation_int8.tflite "ROMEO:" --top-k 10 --seed 1

`predict` streams each continuation as it is decoded (greedy by default; `--top-k`,
`--top-p` or `--temperature` sample, `--seed` makes the draw repeatable: the Keras model and
its fp32 file give the same text for the same seed).
"""

import json
import pathlib
import sys

from keras_attn.export.tflite.generation_file import file_generator
from keras_attn.export.tflite.tflite_metadata import associated_files
from keras_attn.generation import SAMPLERS
from keras_attn.runs.export_directory import CARD_FILE
from keras_attn.runs.overwrite_guard import guarded_export
from keras_attn.stages.generation_exporter import export_generation_run
from keras_attn.text.text_lines import read_lines
from keras_attn.text_generation import GENERATION_TASK
from keras_attn.text_generation import GenerationError
from keras_attn.text_generation import TextGenerator
from keras_attn.text_generation import is_generation_run


def is_generation_artifact(path):
    """A run or export directory of a `causal_lm` run, or one of its `.tflite` files."""
    path = pathlib.Path(path)
    if path.suffix == ".tflite" and path.is_file():
        card = associated_files(path).get(CARD_FILE)
        return card is not None and json.loads(card).get("task") == GENERATION_TASK
    card = path / CARD_FILE
    if card.is_file():
        try:
            return json.loads(card.read_text("utf-8")).get("task") == GENERATION_TASK
        except ValueError:
            return False
    return is_generation_run(path)


def generator_of(path, num_threads=None):
    """The `TextGenerator` of a `causal_lm` run directory (the Keras model), of a generation
    file, or of an export directory (its card's `default_file`)."""
    path = pathlib.Path(path)
    if is_generation_run(path):
        return TextGenerator.from_run(path)
    if path.is_dir():
        card = json.loads((path / CARD_FILE).read_text(encoding="utf-8"))
        path = path / card["default_file"]
    return file_generator(path, num_threads=num_threads)


def add_generation_arguments(predict):
    """`keras-attn predict`'s options for language models."""
    group = predict.add_argument_group(
        "generation (a causal_lm run, its export directory or a generation_*.tflite file; "
        "the TEXTs are prompts)")
    group.add_argument("--max-new-tokens", type=int,
                       help="tokens to generate (default: all the model's positions left)")
    group.add_argument("--sampler", choices=SAMPLERS,
                       help="greedy (the default) or sample (the default when --top-k, "
                            "--top-p or --temperature is given)")
    group.add_argument("--top-k", type=int, help="sample from the k most likely tokens")
    group.add_argument("--top-p", type=float, help="sample from the most likely tokens "
                                                   "holding this probability mass")
    group.add_argument("--temperature", type=float, help="divide the logits by this")
    group.add_argument("--seed", type=int, help="the sampling seed (repeatable output)")


def generation_command(command, args, say):
    """`keras-attn export` or `predict` on a language model; returns the exit status."""
    return _export(args, say) if command == "export" else _predict(args, say)


def _export(args, say):
    output_dir = args.output_dir or str(pathlib.Path(args.run_dir) / "export")
    say(f"keras-attn export {args.run_dir} -> {output_dir} (language model)")
    report = guarded_export(args.run_dir, output_dir, args.overwrite, lambda: (
        export_generation_run(args.run_dir, output_dir, args.eval_split,
                              args.max_eval_examples, args.qat_run, log=say)), log=say,
        reads=[args.qat_run] if args.qat_run else [])
    keras = {row["artifact"]: row["perplexity"] for row in report["artifacts"]
             if "file" not in row}
    say()
    say(f"== artifacts (perplexity on {report['blocks']} {report['eval_split']} blocks; "
        f"Keras model {keras['keras']:.4f}"
        + (f", its QAT model {keras['keras_qat']:.4f})" if "keras_qat" in keras else ")"))
    for row in (row for row in report["artifacts"] if "file" in row):
        say(f"  {row['file']:<34} perplexity {row['perplexity']:.4f}  greedy "
            f"{100 * row['same_as_keras_greedy']:.0f} % as Keras  "
            f"{row['size_bytes'] / 1e6:6.2f} MB  {row['ms_per_token']:.2f} ms/token")
    say(f"  default file: {report['default_file']}; report: "
        f"{pathlib.Path(output_dir) / 'export_report.md'}")
    return 0


def _sampling(args):
    shaped = {"top_k": args.top_k, "top_p": args.top_p, "temperature": args.temperature}
    given = {name: value for name, value in shaped.items() if value is not None}
    sampler = args.sampler or ("sample" if given or args.seed is not None else "greedy")
    sampling = {"sampler": sampler, **given}
    if args.seed is not None:
        sampling["seed"] = args.seed
    return sampling


def _predict(args, say):
    if args.file:
        prompts = [line for _, line in read_lines(args.file) if line.strip()]
    else:
        prompts = list(args.texts)
    if not prompts:
        raise GenerationError("give the prompts as TEXT arguments or --file FILE (one per "
                              "line)")
    generator = generator_of(args.artifact, num_threads=args.threads)
    sampling = _sampling(args)
    for number, prompt in enumerate(prompts):
        if args.json:
            text = generator.generate(prompt, args.max_new_tokens, **sampling)
            say(json.dumps({"prompt": prompt, "text": text}, ensure_ascii=False))
            continue
        _note_unknown(generator.codec, prompt)
        if number:
            say()
        pieces = [prompt]  # the prompt is written with the first piece (after the checks)

        def write(text):
            sys.stdout.write("".join(pieces) + text)
            sys.stdout.flush()
            pieces.clear()

        generator.generate(prompt, args.max_new_tokens, on_text=write, **sampling)
        say("".join(pieces))
    return 0


def _note_unknown(codec, prompt):
    """A note on stderr naming the prompt's characters the vocabulary lacks (the model reads
    them as `[UNK]`)."""
    unknown = sorted({c for c in prompt if codec.kind == "characters"
                      and codec.decode(codec.encode(c)) != c})
    if unknown:
        sys.stderr.write(f"keras-attn predict: note: {''.join(unknown)!r} not in the model's "
                         "characters: read as [UNK]\n")
