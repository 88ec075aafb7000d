"""Small real exports for the web app's browser tests, and Python's answers on them.

Usage: python apps/web_demo/tools/make_test_exports.py OUT_DIR

Runs the demo's pipeline (`keras_attn.demo.run_demo`: the embedded sample data, sentiment and
named entities, length 48) on the `bert_tiny` preset with all-MiniLM-L6-v2's vocabulary, at
the cheapest export settings, so every file the page loads is what `keras-attn export`
writes for a real run (self-describing `.tflite` with length buckets, both `.onnx` files),
only smaller. Then writes `OUT_DIR/reference.json` (`python_reference.py`: Python LiteRT's
logits and `keras-attn predict`'s result for each golden text of each export and file).
Re-running reuses finished steps. About 3 minutes on two cores.
"""

import json
import pathlib
import sys

from keras_attn import demo
from keras_attn.export.run_exporter import ExportOptions
from keras_attn.training.quantization_recipe import QuantizationRecipe

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from python_reference import DEFAULT_FILES  # noqa: E402
from python_reference import reference  # noqa: E402

EPOCHS = 3
GOLDEN_DATA_SENTENCES = 24
OPTIONS = ExportOptions(latency_runs=1, latency_threads=(1,), text_tflite=False,
                        golden_examples=GOLDEN_DATA_SENTENCES, max_eval_examples=16,
                        quantization=QuantizationRecipe(calibration_examples=16))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        sys.exit(f"usage: python {pathlib.Path(__file__).name} OUT_DIR")
    out = pathlib.Path(argv[0])
    demo.run_demo(out, model={"preset": "bert_tiny"}, epochs=EPOCHS, export_options=OPTIONS,
                  log=print)
    document = reference([out / name / "export" for name in demo.DEMO_TASKS], DEFAULT_FILES)
    (out / "reference.json").write_text(json.dumps(document, ensure_ascii=False))
    print(f"exports and reference.json in {out}")


if __name__ == "__main__":
    main()
