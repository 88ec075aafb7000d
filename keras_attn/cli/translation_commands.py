"""`keras-attn export`, `predict` and `explain` on translations: a `seq2seq` run, its export
directory, or one of its translation `.tflite` files (`translation_command`).

    keras-attn predict runs/multi30k_transformer "Ein Mann fährt Fahrrad."
    keras-attn predict runs/multi30k_transformer/export --input test.de --output test.en
    keras-attn predict translation_int8.tflite --input test.de --beams 4
"""

import json
import pathlib
import sys
import time

from keras_attn import atomic_files
from keras_attn.export.onnx.translation_onnx import ENCODER_NAME
from keras_attn.export.onnx.translation_onnx import TranslationOnnx
from keras_attn.export.tflite.tflite_metadata import associated_files
from keras_attn.export.tflite.translation_file import TranslationFile
from keras_attn.export.tflite.translation_file import runtime_translator
from keras_attn.runs.export_directory import CARD_FILE
from keras_attn.runs.overwrite_guard import guarded_export
from keras_attn.stages.translation_exporter import export_translation_run
from keras_attn.text.text_lines import read_lines
from keras_attn.translation import TRANSLATION_TASK
from keras_attn.translation import TranslationError
from keras_attn.translation import Translator
from keras_attn.translation import is_translation_run
from keras_attn.visualization import plot_attention


def is_translation_export(path):
    """Whether `path` is an export directory of a translation run (its `model_card.json`
    names task `seq2seq`)."""
    card = pathlib.Path(path) / CARD_FILE
    try:
        return card.is_file() and json.loads(card.read_text("utf-8")).get(
            "task") == TRANSLATION_TASK
    except (OSError, ValueError):
        return False


def is_translation_artifact(path):
    """A run or export directory of a translation run, or a translation `.tflite` file."""
    path = pathlib.Path(path)
    if path.suffix == ".tflite" and path.is_file():
        card = associated_files(path).get(CARD_FILE)
        return card is not None and json.loads(card).get("task") == TRANSLATION_TASK
    if path.suffix == ".onnx" and path.is_file():
        return path.name.startswith(ENCODER_NAME)
    return is_translation_run(path) or is_translation_export(path)


def translator_of(path, num_beams=None, num_threads=None):
    """The `Translator` of a translation run directory (the Keras model), of a translation
    file (`.tflite`, or the ONNX encoder file with its step beside it), or of an export
    directory (its card's `default_file`)."""
    path = pathlib.Path(path)
    if is_translation_run(path):
        return Translator.from_run(path, num_beams=num_beams)
    if path.is_dir():
        card = json.loads((path / CARD_FILE).read_text(encoding="utf-8"))
        path = path / card["default_file"]
    runtime = (TranslationOnnx if path.suffix == ".onnx" else TranslationFile)(
        path, num_threads=num_threads)
    return runtime_translator(runtime, num_beams=num_beams)


def translation_command(command, args, say):
    """`keras-attn export`, `predict` or `explain` on a translation run; returns the exit
    status (the command line's one handler reports a `TranslationError`)."""
    return {"export": _export, "explain": _explain, "predict": _predict}[command](args, say)


def _export(args, say):
    """The translation files of a seq2seq run and their BLEU."""
    output_dir = args.output_dir or str(pathlib.Path(args.run_dir) / "export")
    say(f"keras-attn export {args.run_dir} -> {output_dir} (translation)")
    report = guarded_export(args.run_dir, output_dir, args.overwrite, lambda: (
        export_translation_run(args.run_dir, output_dir, args.eval_split,
                               args.max_eval_examples, args.qat_run, log=say)), log=say,
        reads=[args.qat_run] if args.qat_run else [])
    keras = {row["artifact"]: row["bleu"] for row in report["artifacts"] if "file" not in row}
    say()
    say(f"== artifacts ({report['examples']:,} {report['eval_split']} pairs, "
        f"{report['num_beams']} beams, 1 thread; Keras model BLEU {keras['keras']:.2f}"
        + (f", its QAT model {keras['keras_qat']:.2f})" if "keras_qat" in keras else ")"))
    for row in (row for row in report["artifacts"] if "file" in row):
        say(f"  {row['file']:<34} BLEU {row['bleu']:.2f}  {row['size_bytes'] / 1e6:6.1f} MB  "
            f"{row['ms_per_sentence']:.1f} ms/sentence")
    say(f"  default file: {report['default_file']}; report: "
        f"{pathlib.Path(output_dir) / 'export_report.md'}")
    return 0


def _predict(args, say):
    texts = list(args.texts)
    if bool(texts) == bool(args.input):
        raise TranslationError("give the sentences to translate as arguments or "
                               "--input FILE (one per line), one of the two")
    translator = translator_of(args.artifact, num_beams=args.beams, num_threads=args.threads)
    if texts:
        for translation in translator.translate(texts, args.batch_size):
            say(translation)
        return 0
    lines = [line for _, line in read_lines(args.input)]
    started = time.perf_counter()

    def progress(done, total):
        rate = done / max(time.perf_counter() - started, 1e-9)
        sys.stderr.write(f"\rtranslated {done:,}/{total:,} sentences ({rate:.1f}/s)")
        sys.stderr.flush()

    translations = translator.translate(lines, args.batch_size, progress)
    sys.stderr.write("\n")
    if args.output:
        atomic_files.write_text(args.output, "".join(t + "\n" for t in translations))
        say(f"wrote {len(translations):,} translations to {args.output}")
    else:
        for translation in translations:
            say(translation)
    return 0


def _explain(args, say):
    translator = Translator.from_run(args.run_dir)
    alignment = translator.alignment(args.text)
    plot_attention(args.output, alignment["weights"], alignment["target_tokens"],
                   alignment["source_tokens"],
                   title=f"{args.text}\n-> {alignment['translation']}")
    say(f"keras-attn explain {args.run_dir}: translation: {alignment['translation']}")
    say(f"  cross-attention of {len(alignment['target_tokens'])} target x "
        f"{len(alignment['source_tokens'])} source pieces: {args.output}")
    return 0
