"""What `keras-attn predict --json` prints for the golden texts of each model, as the web
library's `results.ts` must reproduce it.

Usage: python apps/web_demo/test/predict_results.py GOLDEN_ROOT OUT_DIR

For every model directory under GOLDEN_ROOT (written by
`apps/android_demo/tools/make_golden_vectors.py`), writes `OUT_DIR/<name>.jsonl`: one result
dict per record of its `golden_vectors.jsonl`, made by the `IdsPredictor` that `keras-attn
predict` builds for a token-ids `.tflite` file, with the model replaced by the recorded logits
(as float32, what a `.tflite` file outputs). So the tokenization, the float32 CRF Viterbi path,
the IOB2 repair, the spans and the softmax are Python's own, on the logits the web test feeds
to `classificationResult` / `nerResult`.
"""

import json
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[3]


def recorded_logits(records, task, sequence_length):
    """A `run_logits` that returns the next records' logits, checking their token ids."""
    position = 0

    def run_logits(x):
        import numpy as np

        nonlocal position
        batch = records[position: position + len(x["token_ids"])]
        position += len(batch)
        rows = []
        for row, record in enumerate(batch):
            n = len(record["token_ids"])
            if x["token_ids"][row, :n].tolist() != record["token_ids"]:
                sys.exit(f"error: token ids of {record['text']!r} differ from the golden record")
            logits = np.asarray(record["logits"], "float32")
            if task == "ner":  # (n, C) real positions, padded to the sequence length
                logits = np.concatenate([logits, np.zeros((sequence_length - n, logits.shape[1]),
                                                          "float32")])
            rows.append(logits)
        return np.stack(rows)

    return run_logits


def write_results(model_dir, out_path):
    from keras_attn.stages.inference.ids_predictor import IdsPredictor
    from keras_attn.runs import ExportDirectory

    artifact = model_dir / "model.tflite"  # not read: only its directory's side files are
    card = ExportDirectory(model_dir).model_card()
    with open(model_dir / "golden_vectors.jsonl", encoding="utf-8") as f:
        records = [json.loads(line) for line in f]
    run_logits = recorded_logits(records, card.task, card.sequence_length)
    ids_predictor = IdsPredictor(artifact, "tflite", run_logits, card)
    results = ids_predictor.predict([record["text"] for record in records], batch_size=64)
    with open(out_path, "w", encoding="utf-8") as f:
        for result in results:
            f.write(json.dumps(result, ensure_ascii=True) + "\n")
    return len(results)


def main(argv):
    if len(argv) != 2:
        sys.exit("usage: predict_results.py GOLDEN_ROOT OUT_DIR")
    root, out = pathlib.Path(argv[0]), pathlib.Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    directories = sorted(path.parent for path in root.glob("*/golden_vectors.jsonl"))
    if not directories:
        sys.exit(f"error: no */golden_vectors.jsonl under {root}")
    for directory in directories:
        count = write_results(directory, out / f"{directory.name}.jsonl")
        print(f"{directory.name}: {count} predict results")


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main(sys.argv[1:])
