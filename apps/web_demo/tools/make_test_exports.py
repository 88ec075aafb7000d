"""Small real exports for the web app's browser tests, and Python's answers on them.

Usage: python apps/web_demo/tools/make_test_exports.py OUT_DIR

Trains the demo's two tasks (`keras_attn.stages.demo.demo_config`: the embedded sample data,
sentiment and named entities, length 48) on a 2-layer `bert_tiny` with all-MiniLM-L6-v2's
WordPiece vocabulary (so the hard cases and real sentences tokenize as in a real export), at a
learning rate a tiny model learns with, and exports them with `export_run` at the cheapest
settings: every file the page loads is what `keras-attn export` writes for a real run
(self-describing `.tflite` with length buckets, both `.onnx` files), only smaller. Then writes
`OUT_DIR/reference.json` (`python_reference.py`: Python LiteRT's logits and `keras-attn
predict`'s result for each golden text of each export and file; and, under `translation`,
the toy translation export's, below). Re-running reuses finished runs and exports. About 4
minutes on two cores.

Also a toy translation export, `OUT_DIR/translation/export` (`keras-attn export` of the
recipe of tests/test_seq2seq_task.py's `toy_run`: 320 English->German word-for-word pairs,
8 epochs of a 1-layer `transformer_tiny` of width 32), with its dev sources in
`OUT_DIR/translation/dev.en`, for the web library's translation test
(test/translation.test.ts), and Python LiteRT's translations of the dev sources and a few
sources off the toy's distribution (`translation_reference.py decode`: source ids, greedy and
beam search ids, texts; fp32 and int8 files) under `translation` in `reference.json`, for
the Translate tab's browser test (e2e/translate.spec.ts).

And a toy language model export, `OUT_DIR/generation/export` (`keras-attn export` of
tests/test_generation_exporter.py's `toy_run`: a 2-layer character GPT of width 32 and 32
positions trained on rotations of one line), with Python LiteRT's greedy generations of a
few prompts (`generation_reference.py`: prompt ids, greedy ids, text, streamed pieces; fp32
and int8 files) under `generation` in `reference.json`, for the web library's generation test
(test/generation.test.ts) and the Generate tab's browser test (e2e/generate.spec.ts).
"""

import json
import pathlib
import sys

from keras_attn import cli
from keras_attn.runs.quantization_recipe import QuantizationRecipe
from keras_attn.runs.training_config import TrainingConfig
from keras_attn.stages import demo
from keras_attn.stages.export_options import ExportOptions
from keras_attn.stages.run_exporter import export_run
from keras_attn.stages.train_stage import Trainer
from keras_attn.training.tasks.task import minilm_directory

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(1, str(pathlib.Path(__file__).resolve().parents[3]))  # the repository: tests/
from generation_reference import generation_reference  # noqa: E402
from python_reference import DEFAULT_FILES  # noqa: E402
from python_reference import reference  # noqa: E402
from translation_reference import decode_reference  # noqa: E402

from tests.test_generation_exporter import toy_run  # noqa: E402
from tests.test_seq2seq_task import make_config  # noqa: E402
from tests.test_seq2seq_task import toy_pairs  # noqa: E402
from tests.test_seq2seq_task import write_parallel  # noqa: E402

EPOCHS = 12
LEARNING_RATE = 3e-3
GOLDEN_DATA_SENTENCES = 24
MODEL = {"preset": "bert_tiny", "overrides": {"num_layers": 2}}
# Sources off the toy's distribution where beam search and greedy decoding part (from
# test/translation.test.ts's HARD: the first runs all 16 steps without EOS), so the browser
# test's beam search check reaches beyond greedy decoding.
TRANSLATION_EXTRA_TEXTS = ("five - vier one three six two eins one ! ?", "! funf eins funf",
                           "eins ! five two zwei zwei drei", "four")
TRANSLATION_FILES = ("translation_fp32.tflite", "translation_int8.tflite")
OPTIONS = ExportOptions(latency_runs=1, latency_threads=(1,), text_tflite=False,
                        golden_examples=GOLDEN_DATA_SENTENCES, max_eval_examples=16,
                        quantization=QuantizationRecipe(calibration_examples=16))


def train_and_export(name, out):
    """The export directory of demo task `name`, trained and exported unless done."""
    model = dict(MODEL, vocabulary=str(pathlib.Path(minilm_directory()) / "vocab.txt"))
    values = demo.demo_config(name, out, model=model, epochs=EPOCHS).to_dict()
    values["train"]["learning_rate"] = LEARNING_RATE
    config = TrainingConfig.from_dict(values, source=f"make_test_exports ({name})")
    run_dir, export_dir = pathlib.Path(config.output_dir), out / name / "export"
    if not (run_dir / "metrics.json").is_file():
        Trainer(config).run()
    if not (export_dir / "export_report.json").is_file():
        export_run(run_dir, export_dir, OPTIONS, log=print)
    return export_dir


def translation_export(out):
    """The export directory of the toy translation run (tests/test_seq2seq_task.py's
    `toy_run` recipe and data), trained and exported unless done."""
    folder = out / "translation"
    folder.mkdir(parents=True, exist_ok=True)
    values = make_config(folder, write_parallel(folder, "train", toy_pairs(320, seed=0)),
                         write_parallel(folder, "dev", toy_pairs(12, seed=1)),
                         epochs=8).to_dict()
    config = TrainingConfig.from_dict(values, source="make_test_exports (translation)")
    run_dir, export_dir = folder / "run", folder / "export"
    if not (run_dir / "metrics.json").is_file():
        Trainer(config).run()
    if not (export_dir / "export_report.json").is_file():
        if cli.main(["export", str(run_dir), "--output-dir", str(export_dir)]) != 0:
            sys.exit(f"error: keras-attn export {run_dir} failed")
    return export_dir


def translation_reference(export_dir):
    """Python LiteRT's translations (`decode_reference`) of the dev sources and
    `TRANSLATION_EXTRA_TEXTS` on `TRANSLATION_FILES` of the toy export."""
    dev = (export_dir.parent / "dev.en").read_text("utf-8").splitlines()
    texts = [line for line in dev if line] + list(TRANSLATION_EXTRA_TEXTS)
    return decode_reference(export_dir, texts, TRANSLATION_FILES)


def generation_export(out):
    """The export directory of the toy language model run (tests/test_generation_exporter.py's
    `toy_run`), trained and exported unless done."""
    folder = out / "generation"
    folder.mkdir(parents=True, exist_ok=True)
    run_dir, export_dir = folder / "run", folder / "export"
    if not (run_dir / "metrics.json").is_file():
        toy_run(folder)
    if not (export_dir / "export_report.json").is_file():
        if cli.main(["export", str(run_dir), "--output-dir", str(export_dir)]) != 0:
            sys.exit(f"error: keras-attn export {run_dir} failed")
    return export_dir


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        sys.exit(f"usage: python {pathlib.Path(__file__).name} OUT_DIR")
    out = pathlib.Path(argv[0])
    exports = [train_and_export(name, out) for name in demo.DEMO_TASKS]
    document = reference(exports, DEFAULT_FILES)
    document["translation"] = translation_reference(translation_export(out))
    document["generation"] = generation_reference(generation_export(out))
    (out / "reference.json").write_text(json.dumps(document, ensure_ascii=False))
    print(f"exports and reference.json in {out}")


if __name__ == "__main__":
    main()
