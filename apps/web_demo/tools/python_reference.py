"""What Python computes for the web app's checks: per exported `.tflite` file and text, the
logits of Python LiteRT and the result of `keras-attn predict --json`.

Usage:
    python apps/web_demo/tools/python_reference.py OUT.json EXPORT_DIR [EXPORT_DIR ...]
        [--files model_fp32.tflite,model_int8.tflite,...] [--texts FILE] [--limit N]

Texts: each export's `golden_vectors.jsonl` (the hard cases and data sentences the export
wrote), or one text per line of `--texts` for every export. The logits are those of the call
`load_predictor(file).predict([text])` makes (batch 1, the shortest length bucket that holds
the text, as the app runs it), taken at the predictor's model call: `(C,)` for a classifier,
`(n, C)` for a tagger's `n` real tokens. float32 values are written as the shortest decimal
that reads back to the same double, so the browser can compare int8 files bit for bit.

The JSON: `{"exports": [{"dir", "task", "fp32_atol", "output_steps", "files": {name:
[{"text", "logits", "result"}]}}]}`. `fp32_atol` bounds how far a float32 file's logits may
move on another runtime's kernels (`tests/tolerances.py`, from the source run's model size);
`output_steps` gives, per file whose logits are dequantized from int8, the scale of that int8
tensor: one step of the logits. (An int8 file keeps attention, GELU and LayerNorm in float;
on other float kernels a value at a rounding boundary of a later requantization can land one
step away.)
"""

import argparse
import json
import pathlib
import sys

import keras
import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))
from ai_edge_litert.interpreter import Interpreter  # noqa: E402

from keras_attn.runs import ExportDirectory  # noqa: E402
from keras_attn.stages.inference.predictor import load_predictor  # noqa: E402
from tests.tolerances import float32_path_atol  # noqa: E402

DEFAULT_FILES = ("model_fp32.tflite", "model_dynamic_int8.tflite", "model_int8.tflite",
                 "model_int8_buckets.tflite")


def golden_texts(export_dir):
    """The texts of an export's `golden_vectors.jsonl`, in order."""
    path = pathlib.Path(export_dir) / "golden_vectors.jsonl"
    if not path.is_file():
        raise SystemExit(f"error: {path} is missing: pass --texts FILE, or export with "
                         "golden vectors (keras-attn export writes them by default)")
    return [json.loads(line)["text"] for line in path.read_text("utf-8").splitlines() if line]


class LogitsTap:
    """Wraps a predictor's model call and keeps the real rows of the last logits."""

    def __init__(self, run_logits):
        self.run_logits = run_logits
        self.last = None

    def __call__(self, inputs):
        logits = np.asarray(self.run_logits(inputs))
        mask = np.asarray(inputs["padding_mask"])[0].astype(bool)
        self.last = logits[0] if logits.ndim == 2 else logits[0][mask]
        return logits


def file_reference(path, texts):
    """`[{"text", "logits", "result"}]` of one artifact, one text per call."""
    predictor = load_predictor(path, num_threads=1)
    tap = LogitsTap(predictor.run_logits)
    predictor.run_logits = tap
    predictor.model.run_logits = tap
    records = []
    for text in texts:
        (result,) = predictor.predict([text])
        logits = [] if tap.last is None else np.asarray(tap.last, "float32").tolist()
        records.append({"text": text, "logits": logits, "result": result})
        tap.last = None
    return predictor.task, records


def output_step(path):
    """The scale of the int8 tensor the logits are dequantized from, or `None` (float)."""
    interpreter = Interpreter(model_path=str(path))
    (output,) = [d["index"] for d in interpreter.get_output_details()][:1]
    for op in interpreter._get_ops_details():  # noqa: SLF001 - LiteRT has no public op list
        if output in op["outputs"] and op["op_name"] == "DEQUANTIZE":
            source = interpreter._get_tensor_details(op["inputs"][0], 0)  # noqa: SLF001
            return float(source["quantization_parameters"]["scales"][0])
    return None


def fp32_atol(export_dir, records):
    """`float32_path_atol` of the export's float32 logits: 6 reductions a block plus the
    embedding norm, pooler and head, sums of up to the intermediate size (as
    `tests/test_predictor.py` bounds LiteRT against Keras)."""
    source_run = ExportDirectory(export_dir).source_run()
    backbone = keras.models.load_model(pathlib.Path(source_run) / "model.keras").backbone
    values = [v for r in records for v in np.ravel(r["logits"])] or [1.0]
    return float32_path_atol(values, reduction=backbone.intermediate_dim,
                             depth=6 * backbone.num_layers + 3)


def reference(export_dirs, files, texts=None, limit=None):
    """The JSON document (a dict) for `export_dirs`."""
    exports = []
    for export_dir in map(pathlib.Path, export_dirs):
        chosen = (texts if texts is not None else golden_texts(export_dir))[:limit]
        entry = {"dir": str(export_dir.resolve()), "files": {}, "output_steps": {}}
        for name in files:
            if not (export_dir / name).is_file():
                raise SystemExit(f"error: {export_dir / name} is missing: export with "
                                 "`keras-attn export` (length buckets on), or pass --files")
            entry["task"], entry["files"][name] = file_reference(export_dir / name, chosen)
            entry["output_steps"][name] = output_step(export_dir / name)
        float_records = entry["files"].get("model_fp32.tflite")
        entry["fp32_atol"] = float_records and fp32_atol(export_dir, float_records)
        exports.append(entry)
    return {"exports": exports}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=pathlib.Path)
    parser.add_argument("export_dirs", nargs="+")
    parser.add_argument("--files", default=",".join(DEFAULT_FILES))
    parser.add_argument("--texts", type=pathlib.Path, help="one text per line")
    parser.add_argument("--limit", type=int, help="the first N texts only")
    args = parser.parse_args(argv)
    texts = None
    if args.texts:
        texts = args.texts.read_text("utf-8").splitlines()
    document = reference(args.export_dirs, args.files.split(","), texts, args.limit)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, ensure_ascii=False))
    counts = {pathlib.Path(e["dir"]).name: len(next(iter(e["files"].values()), []))
              for e in document["exports"]}
    print(f"python reference -> {args.out}: texts per export {counts}")


if __name__ == "__main__":
    sys.exit(main())
