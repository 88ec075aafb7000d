"""The character-level comparison of docs/results.md: a deep character Transformer without
and with the auxiliary losses of Al-Rfou et al. (2018), and Transformer-XL of the same size
(Dai et al., 2019), trained on Shakespeare with the same number of updates, scored on Hamlet.

    PYTHONPATH=. python training/run_char_results.py              # trains the 3, then scores
    PYTHONPATH=. python training/run_char_results.py --skip-training --runs runs

Run from the repository root (the configs name ../../shared/data relative to training/,
or relative to the working directory). Trains one run at a time. Writes
`<runs>/char_results.json`, prints the table rows, the evaluation speeds and a
500-character sample of the model with the lowest test bits per character, and writes the
table into the `results:char` section and the sample into the `results:char-sample`
section of `--results` (docs/results.md), leaving the rest of the page as it is
(`keras_attn.page_sections`).
"""

import argparse
import json
import pathlib
import subprocess
import sys
import time

import keras
import numpy as np
import tensorflow as tf

from keras_attn.models.transformer_xl_lm import TransformerXLLM
from keras_attn.page_sections import replace_section
from keras_attn.text.character_tokenizer import CharacterTokenizer
from keras_attn.training.tasks.causal_lm_task import read_character_text
from keras_attn.training.tasks.character_evaluation import bits_per_character
from keras_attn.training.tasks.character_evaluation import segment_memory_nll
from keras_attn.training.tasks.character_evaluation import sliding_window_nll

HERE = pathlib.Path(__file__).resolve().parent
ROWS = (("none", "deep char Transformer, no auxiliary losses"),
        ("aux", "the same with the three auxiliary losses"),
        ("txl", "Transformer-XL of the same size, memory = segment length"))
SHORT_NAMES = {"none": "the deep char Transformer without auxiliary losses",
               "aux": "the deep char Transformer with the auxiliary losses",
               "txl": "Transformer-XL"}
SPEED_CHARACTERS = 1000  # Hamlet prefix both evaluations score, for their speed
SAMPLE_CHARACTERS = 500


def train_run(name, runs):
    config = HERE / f"shakespeare_char_{name}.yaml"
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "keras_attn.cli", "train", str(config),
                    "--output-dir", str(runs / name)], check=True)
    return time.perf_counter() - started


def sample(step, prompt_ids, count, seed, temperature=0.8):
    """`count` ids drawn one at a time from `step(ids) -> logits of the next id`."""
    rng = np.random.default_rng(seed)
    ids = list(prompt_ids)
    for _ in range(count):
        logits = np.asarray(step(ids), "float64") / temperature
        probs = np.exp(logits - logits.max())
        ids.append(int(rng.choice(len(probs), p=probs / probs.sum())))
    return ids[len(prompt_ids):]


def window_step(model, context):
    forward = tf.function(lambda x: model(x, training=False), reduce_retracing=True)

    def step(ids):
        window = np.array([ids[-context:]], "int32")
        logits = forward({"token_ids": window, "padding_mask": np.ones_like(window)})
        return keras.ops.convert_to_numpy(logits)[0, -1]
    return step


def memory_step(lm, memory_length):
    """Feeds each new id once, carrying the memory (no window recomputed)."""
    forward = tf.function(lambda x: lm(x, training=False), reduce_retracing=True)
    state = {"read": 0, **lm.initial_memory(1, memory_length)}

    def step(ids):
        new = np.array([ids[state["read"]:]], "int32")
        out = forward({"token_ids": new, "memory": state["memory"],
                       "memory_padding_mask": state["memory_padding_mask"]})
        state.update(read=len(ids), memory=out["memory"],
                     memory_padding_mask=out["memory_padding_mask"])
        return keras.ops.convert_to_numpy(out["logits"])[0, -1]
    return step


def score(name, run, test_ids):
    metrics = json.loads((run / "metrics.json").read_text())
    model = keras.models.load_model(run / "model.keras")
    context = metrics["config"]["data"]["max_length"]
    row = {"run": name, "parameters": model.count_params(), "updates": metrics["updates"],
           "context": context,
           "train_seconds": metrics["train_seconds_this_process"],
           "wall_seconds": metrics["wall_seconds_this_process"],
           "test_bpc_training_eval": metrics["test"]["bits_per_character"],
           "best_dev_bpc": metrics["best_dev"]["bits_per_character"]}
    if isinstance(model, TransformerXLLM):
        memory = metrics["config"]["data"]["eval_memory_length"] or context
        nll, count, seconds = segment_memory_nll(model, test_ids, context, memory)
        row.update(evaluation="segments + memory", memory=memory,
                   test_bpc=bits_per_character(nll, count),
                   test_eval_seconds=seconds)
        nll, count, seconds = segment_memory_nll(model, test_ids, context, memory,
                                                 limit=SPEED_CHARACTERS)
        step = memory_step(model, memory)
    else:
        nll, count, seconds = sliding_window_nll(model, test_ids, context,
                                                 limit=SPEED_CHARACTERS)
        row.update(evaluation="sliding window",
                   test_bpc=metrics["test"]["bits_per_character"])
        step = window_step(model, context)
    row.update(prefix_bpc=bits_per_character(nll, count), prefix_characters=count,
               prefix_seconds=seconds, seconds_per_character=seconds / count)
    return row, step


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="runs/char", help="directory of the three runs")
    parser.add_argument("--skip-training", action="store_true")
    parser.add_argument("--results", default=str(HERE.parent / "docs" / "results.md"))
    args = parser.parse_args(argv)
    runs = pathlib.Path(args.runs)
    if not args.skip_training:
        for name, _ in ROWS:
            train_run(name, runs)
    tokenizer = CharacterTokenizer.load(runs / "none")
    recorded = json.loads((runs / "none" / "metrics.json").read_text())
    test_ids = tokenizer.encode(read_character_text(recorded["config"]["data"]["test"]))
    rows, steps = [], {}
    for name, title in ROWS:
        row, steps[name] = score(name, runs / name, test_ids)
        rows.append({"model": title, **row})
        print(json.dumps(rows[-1]), flush=True)
    best = min(rows, key=lambda r: r["test_bpc"])
    prompt = tokenizer.encode("HAMLET.\n")
    text = tokenizer.decode(sample(steps[best["run"]], prompt, SAMPLE_CHARACTERS, seed=0))
    window = next(r for r in rows if r["run"] == "none")["seconds_per_character"]
    memory = next(r for r in rows if r["run"] == "txl")["seconds_per_character"]
    results = {"rows": rows, "evaluation_speedup": window / memory,
               "sample_model": best["run"], "sample_prompt": "HAMLET.\n", "sample": text}
    (runs / "char_results.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
    print(f"Transformer-XL evaluation {window / memory:.1f}x faster per character than the "
          f"sliding window\n--- sample ({best['run']}) ---\nHAMLET.\n{text}")
    replace_section(args.results, "results:char", results_table(rows))
    replace_section(args.results, "results:char-sample", sample_section(results, best))
    print(f"wrote the character-LM sections of {args.results}")


def results_table(rows):
    """The `results:char` table, one row per run (test bits/char in bold)."""
    lines = ["| model | config | parameters (saved model) | updates | test bits/char (Hamlet) | "
             "evaluation | best dev bits/char (Macbeth) | Hamlet prefix: bits/char, ms per "
             "character | training time |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if r["evaluation"] == "segments + memory":
            evaluation = (f"one read, segments of {r['context']} + memory {r['memory']} "
                          f"({r['test_eval_seconds']:.0f} s)")
            prefix = "segments + memory"
        else:
            evaluation = f"blocks of {r['context']} (mean context {r['context'] // 2})"
            prefix = f"sliding window of {r['context']}"
        lines.append(
            f"| {r['model']} | `training/shakespeare_char_{r['run']}.yaml` | "
            f"{r['parameters']:,} | {r['updates']:,} | **{r['test_bpc']:.3f}** | {evaluation} | "
            f"{r['best_dev_bpc']:.3f} | {r['prefix_bpc']:.3f}, "
            f"{1000 * r['seconds_per_character']:.2f} ms ({prefix}) | "
            f"{r['train_seconds'] / 60:.1f} min ({r['wall_seconds'] / 60:.1f} min wall) |")
    return "\n".join(lines)


def sample_section(results, best):
    """The `results:char-sample` section: the sample of the run with the lowest test
    bits/char, as a code block."""
    how = ("read with its memory" if best["evaluation"] == "segments + memory"
           else f"a sliding window of {best['context']}")
    return (f"Sample: {SAMPLE_CHARACTERS} characters from {SHORT_NAMES[best['run']]} (the "
            f"lowest test bits/char), {how}, one new character per call (temperature 0.8, "
            f"prompt `HAMLET.\\n`, seed 0):\n\n```\n{results['sample']}\n```")


if __name__ == "__main__":
    main()
