"""XLNet vs a causal LM of the same size: predicting a held-out word of Hamlet.

    python training/run_xlnet_results.py --xlnet runs/shakespeare_xlnet \
        --causal-lm runs/shakespeare_causal_lm [--test ../shared/data/shakespeare/test.txt] \
        [--sst2 runs/sst2_xlnet runs/sst2_bert_tiny_500] [--results docs/results.md]

Both runs are `keras-attn train` runs of `training/shakespeare_xlnet.yaml` and
`training/shakespeare_causal_lm.yaml` (same text, vocabulary size, model size, batch and
steps). Hamlet is tokenized as in training (one line, then `[SEP]`) and cut into blocks
of `max_length` tokens. In every block, up to `--per-block` positions holding a whole
word (one WordPiece, not `[SEP]`, not followed by a `##` piece, not the block's first
token) are held out, one at a time:

- XLNet predicts it from both sides: the factorization order that puts it last (no
  position sees its token, it sees all others), its query stream at that position.
- The causal LM predicts it from the left side: its logits at the previous position.

Prints and writes (`--output`, JSON) the accuracy and mean negative log-likelihood of
each model on the same held-out words, and writes the table of both runs (their dev
perplexity, training time and speed from `metrics.json`, then these two numbers) into the
`results:xlnet` section of `--results`. With `--sst2`, the SST-2 fine-tunes of
`training/sst2_xlnet.yaml` and of its bert_tiny baseline `training/sst2_bert_tiny_500.yaml`
go into the `results:xlnet-sst2` section. The rest of the page is left as it is
(`keras_attn.page_sections`).
"""

import argparse
import json
import pathlib

import keras
import numpy as np

from keras_attn.page_sections import replace_section
from keras_attn.text.tokenizer import WordPieceTokenizer
from keras_attn.text.vocabulary import load_vocabulary
from keras_attn.training.tasks.causal_lm_task import read_text_lines

HERE = pathlib.Path(__file__).resolve().parent
MODELS = {"xlnet_both_sides": ("XLNet (`XLNetLM`)", "permutation LM, both sides",
                               "of its permuted targets"),
          "causal_lm_left_side": ("GPT (`GPTCausalLM`)", "causal LM, left side", "next token")}


def hamlet_blocks(run, test_path):
    config = json.loads((run / "config.json").read_text("utf-8"))
    length = config["data"]["max_length"]
    vocabulary = load_vocabulary(run / "vocab.txt")
    tokenizer = WordPieceTokenizer(vocabulary, lowercase=config["model"]["lowercase"],
                                   sequence_length=length)
    pieces = []
    for ids in tokenizer.tokenize(read_text_lines(test_path)).to_list():
        pieces += ids + [tokenizer.sep_token_id]
    stream = np.asarray(pieces, "int32")
    blocks = stream[: len(stream) // length * length].reshape(-1, length)
    return blocks, tokenizer.get_vocabulary(), tokenizer.sep_token_id


def held_out_positions(blocks, vocabulary, sep, per_block, seed):
    rng = np.random.default_rng(seed)
    continuation = np.array([t.startswith("##") for t in vocabulary])
    chosen = []
    for b, block in enumerate(blocks):
        whole = [i for i in range(1, len(block))
                 if block[i] != sep and not continuation[block[i]]
                 and (i + 1 == len(block) or not continuation[block[i + 1]])]
        for i in rng.permutation(whole)[:per_block]:
            chosen.append((b, int(i)))
    return chosen


def xlnet_log_probs(model, blocks, chosen, batch_size=64):
    length = blocks.shape[1]
    out = []
    for start in range(0, len(chosen), batch_size):
        part = chosen[start: start + batch_size]
        ids = np.stack([blocks[b] for b, _ in part])  # (N, T)
        visible = np.ones((len(part), length, length), "int32")
        mapping = np.zeros((len(part), 1, length), "float32")
        for row, (_, i) in enumerate(part):
            visible[row, :, i] = 0  # nobody sees the held-out token: it is last in the order
            mapping[row, 0, i] = 1.0
        logits = model.predict_on_batch({
            "token_ids": ids, "segment_ids": np.zeros_like(ids),
            "padding_mask": np.ones_like(ids), "permutation_mask": visible,
            "target_mapping": mapping})[:, 0]  # (N, V)
        out.append(logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True))
    return np.concatenate(out)


def causal_log_probs(model, blocks, chosen):
    logits = model.predict({"token_ids": blocks, "padding_mask": np.ones_like(blocks)},
                           batch_size=64, verbose=0)  # (N_blocks, T, V)
    rows = np.stack([logits[b, i - 1] for b, i in chosen])  # position i - 1 predicts i
    return rows - np.logaddexp.reduce(rows, axis=-1, keepdims=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--xlnet", required=True)
    parser.add_argument("--causal-lm", required=True)
    parser.add_argument("--test", default="../shared/data/shakespeare/test.txt")
    parser.add_argument("--per-block", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=None)
    parser.add_argument("--sst2", nargs="*", default=[],
                        help="SST-2 fine-tuning runs for the results:xlnet-sst2 section")
    parser.add_argument("--results", default=str(HERE.parent / "docs" / "results.md"))
    args = parser.parse_args(argv)
    runs = {"xlnet_both_sides": pathlib.Path(args.xlnet),
            "causal_lm_left_side": pathlib.Path(args.causal_lm)}
    results = held_out_word_scores(runs, args.test, args.per_block, args.seed)
    text = json.dumps(results, indent=2)
    print(text)
    if args.output:
        pathlib.Path(args.output).write_text(text + "\n", encoding="utf-8")
    replace_section(args.results, "results:xlnet", held_out_table(runs, results))
    if args.sst2:
        replace_section(args.results, "results:xlnet-sst2",
                        sst2_table([pathlib.Path(run) for run in args.sst2]))
    print(f"wrote the XLNet sections of {args.results}")


def held_out_word_scores(runs, test_path, per_block, seed):
    """Accuracy and mean NLL of both models on the same held-out words of `test_path`."""
    xlnet_run, causal_run = runs["xlnet_both_sides"], runs["causal_lm_left_side"]
    blocks, vocabulary, sep = hamlet_blocks(xlnet_run, test_path)
    if (causal_run / "vocab.txt").read_text("utf-8") != (xlnet_run / "vocab.txt").read_text(
            "utf-8"):
        raise SystemExit("the two runs learned different vocabularies: the held-out words "
                         "would not be the same tokens")
    chosen = held_out_positions(blocks, vocabulary, sep, per_block, seed)
    targets = np.array([blocks[b, i] for b, i in chosen])
    results = {"held_out_words": len(chosen), "blocks": len(blocks)}
    for name, log_probs in (
            ("xlnet_both_sides", xlnet_log_probs(
                keras.saving.load_model(xlnet_run / "model.keras"), blocks, chosen)),
            ("causal_lm_left_side", causal_log_probs(
                keras.saving.load_model(causal_run / "model.keras"), blocks, chosen))):
        results[name] = {
            "accuracy": float((log_probs.argmax(-1) == targets).mean()),
            "mean_nll": float(-log_probs[np.arange(len(targets)), targets].mean()),
        }
    return results


def _metrics(run):
    return json.loads((run / "metrics.json").read_text("utf-8"))


def held_out_table(runs, results):
    """The `results:xlnet` table: one row per model, the better score in bold."""
    best_accuracy = max(results[name]["accuracy"] for name in MODELS)
    best_nll = min(results[name]["mean_nll"] for name in MODELS)
    lines = ["| model | objective | Macbeth dev perplexity | Hamlet held-out word: accuracy | "
             "mean NLL (nats) | training time | train tokens/s (last epoch) |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, (model, objective, targets) in MODELS.items():
        metrics, scores = _metrics(runs[name]), results[name]
        accuracy, nll = f"{scores['accuracy']:.4f}", f"{scores['mean_nll']:.3f}"
        lines.append(
            f"| {model} | {objective} | {metrics['best_dev']['perplexity']:.1f} ({targets}) | "
            f"{_bold(accuracy, scores['accuracy'] == best_accuracy)} | "
            f"{_bold(nll, scores['mean_nll'] == best_nll)} | "
            f"{metrics['train_seconds_this_process'] / 60:.1f} min | "
            f"{metrics['history'][-1]['tokens_per_second']:,.0f} |")
    return "\n".join(lines)


def sst2_table(runs):
    """The `results:xlnet-sst2` table: each SST-2 fine-tuning run's initialization, updates,
    best dev accuracy and wall time, from its `metrics.json`."""
    lines = ["| run | initialization | updates | SST-2 dev accuracy | wall time |",
             "| --- | --- | --- | --- | --- |"]
    for run in runs:
        metrics = _metrics(run)
        model = metrics["config"]["model"]
        start = (f"encoder of the run `{pathlib.Path(model['checkpoint']).name}`"
                 if model.get("checkpoint") else
                 f"`{model['preset']}` from random initialization, vocabulary "
                 f"{model['vocabulary_size']:,} learned from the training text")
        lines.append(
            f"| `{run.name}` | {start} | {metrics['updates']:,} | "
            f"{metrics['best_dev']['accuracy']:.4f} | "
            f"{_minutes_seconds(metrics['wall_seconds_this_process'])} |")
    return "\n".join(lines)


def _bold(text, bold):
    return f"**{text}**" if bold else text


def _minutes_seconds(seconds):
    minutes, seconds = divmod(round(seconds), 60)
    return f"{minutes}m{seconds:02d}s"


if __name__ == "__main__":
    main()
