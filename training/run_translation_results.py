"""Writes the translation section of docs/results.md from finished Multi30k runs.

    keras-attn train training/multi30k_transformer.yaml      # runs/multi30k_transformer
    keras-attn train training/multi30k_rnn.yaml              # runs/multi30k_rnn
    python training/run_translation_results.py runs/multi30k_transformer runs/multi30k_rnn

For every run: the model, its parameters, test BLEU with the sacreBLEU signature (from the
run's metrics.json), validation BLEU per epoch, training tokens/s, training time and wall
time (training and validation, summed over the epochs; epochs of an older version that did not
record their time get it from their own rates, and the row says how many) and the CPU. Each
`--checkpoint RUN STEP_DIR` adds the row of a step checkpoint of a run (its weights in the
run's model, its epochs and their time, the test BLEU measured here): a run's state when a
shorter training budget would have stopped it, best epoch by validation BLEU (with
`--epoch-seconds S`, its training time is S an epoch, e.g. the run's epoch measured alone);
then decoding speed (sentences/s) on the first `--speed-sentences` test sources, greedy
and beam search, with and without the key/value cache, measured here (the trace of each
decoder is done before the clock starts); and one alignment picture
(`--picture`, the first run's cross-attention for `SENTENCE`). The section replaces
what is between `<!-- translation:begin -->` and `<!-- translation:end -->` in
`--results` (appended with the markers when they are missing); the rest of the page is
left as it is.
"""

import argparse
import json
import pathlib
import sys

import sacrebleu

from keras_attn.machine import cpu_model
from keras_attn.text.parallel_corpus import read_parallel_files
from keras_attn.training.step_checkpoints import StepCheckpoints
from keras_attn.translation import Translator
from keras_attn.visualization import plot_attention

BEGIN, END = "<!-- translation:begin -->", "<!-- translation:end -->"
# Published German -> English numbers on this test set, trained on Multi30k's 29k pairs (as
# read in the sources; none is cased sacreBLEU on detokenized text).
PUBLISHED = [
    "Lample et al. 2018, *Unsupervised Machine Translation Using Monolingual Corpora Only* "
    "(ICLR, arXiv:1711.00043), Table 2, row “Supervised”, de-en: **38.38** — a 3-layer "
    "BiLSTM encoder / LSTM decoder with attention, greedy decoding; the BLEU script is not "
    "stated and the paper's text is lowercased and tokenized.",
    "bentrevett/pytorch-seq2seq (commit 7faa64a, 2021), notebook 6 *Attention is All You "
    "Need*: **36.52** (a 3 + 3-layer Transformer, d 256, 8 heads, d_ff 512, 10 epochs); "
    "notebook 5, ConvS2S: 34.14; notebook 4, bidirectional GRU with Bahdanau attention: "
    "**28.11** — torchtext `bleu_score` on spaCy-tokenized, lowercased tokens, greedy "
    "decoding (earlier commits of the same notebooks printed 35.08–36.09 and 28.57–29.04).",
]
SENTENCE = "Ein Mann fährt Fahrrad."


def epoch_minutes(history, epoch_tokens=None):
    """`(training minutes, wall minutes, derived)` of the epochs of `history` (wall: training
    and validation). Epochs recorded by an older version without their times (`derived` of
    them) get them from their own rates: the epoch's tokens (as recorded by the others, or
    `epoch_tokens`) at its tokens/s, the validation pairs at its decoding sentences/s."""
    tokens = [h["tokens"] for h in history if "tokens" in h]
    epoch_tokens = sum(tokens) / len(tokens) if tokens else epoch_tokens
    train = wall = 0.0
    derived = 0
    for record in history:
        if "train_seconds" in record:
            seconds = record["train_seconds"]
            validation = record.get("eval_seconds", 0.0)
        elif epoch_tokens is not None:
            derived += 1
            seconds = epoch_tokens / record["tokens_per_second"]
            dev = record.get("dev") or {}
            validation = (dev["pairs"] / dev["decoding_sentences_per_second"]
                          if dev.get("decoding_sentences_per_second") else 0.0)
        else:
            raise ValueError("no epoch of this run records its tokens and times: train it "
                             "with this version of keras-attn")
        train += seconds
        wall += seconds + validation
    return train / 60, wall / 60, derived


def run_summary(run_dir, translator=None):
    """The row of one run from its metrics.json and model (`translator`: the run's, if
    already loaded)."""
    run = pathlib.Path(run_dir)
    metrics = json.loads((run / "metrics.json").read_text(encoding="utf-8"))
    translator = translator or Translator.from_run(run)
    history = metrics["history"]
    tokens = [h["tokens"] for h in history if "tokens" in h]
    test = metrics.get("test") or {}
    train_minutes, wall_minutes, derived = epoch_minutes(history)
    average = metrics.get("checkpoint_average") or {}
    return {
        "run": str(run), "label": f"`{run}`", "model": type(translator.model).__name__,
        "parameters": translator.model.count_params(),
        "test_bleu": test.get("bleu"), "signature": test.get("bleu_signature"),
        "dev_bleu": [round(h["dev"]["bleu"], 2) for h in history if "dev" in h],
        "best_epoch": metrics["best_epoch"], "epochs": len(history),
        "averaged": average.get("epochs") if average.get("used") else None,
        "tokens_per_second": history[-1]["tokens_per_second"] if history else None,
        "train_minutes": train_minutes, "wall_minutes": wall_minutes,
        "derived_epochs": derived, "cpu_count": metrics["machine"]["cpu_count"],
        "epoch_tokens": sum(tokens) / len(tokens) if tokens else None,
    }


def checkpoint_summary(run_dir, checkpoint, pairs, epoch_seconds=None):
    """The row of the step checkpoint `checkpoint` of a run, its own weights scored on the
    test `pairs` (give the end of the best epoch up to then, as a run stopped there would
    keep). Its training time: as its epochs recorded it, or `epoch_seconds` an epoch (then
    no wall time is given)."""
    translator = Translator.from_run(run_dir)
    row = run_summary(run_dir, translator)
    checkpoints = StepCheckpoints(pathlib.Path(checkpoint).parent)
    meta, arrays = checkpoints.read(checkpoint, translator.model, None, owners=("model",))
    for variable, array in zip(translator.model.variables, arrays):
        variable.assign(array)
    history = meta["trainer_state"]["history"]
    hypotheses = translator.translate([p.source for p in pairs])
    score = sacrebleu.metrics.BLEU()
    bleu = score.corpus_score(hypotheses, [[p.target for p in pairs]])
    if epoch_seconds is None:
        train_minutes, wall_minutes, derived = epoch_minutes(history, row["epoch_tokens"])
        timing = {}
    else:
        train_minutes, wall_minutes, derived = len(history) * epoch_seconds / 60, None, 0
        timing = {"epoch_seconds": epoch_seconds}
    row.update(label=f"`{checkpoint}`", test_bleu=bleu.score,
               signature=str(score.get_signature()), epochs=len(history),
               dev_bleu=[round(h["dev"]["bleu"], 2) for h in history if "dev" in h],
               best_epoch=meta["trainer_state"]["best_epoch"], averaged=None,
               tokens_per_second=history[-1]["tokens_per_second"],
               train_minutes=train_minutes, wall_minutes=wall_minutes,
               derived_epochs=derived, **timing)
    return row


def decoding_speed(run_dir, sources, batch_size, beams):
    """Sentences/s of greedy and `beams`-beam decoding, with and without the cache."""
    speeds = {}
    for num_beams in (1, beams):
        for use_cache in (True, False):
            translator = Translator.from_run(run_dir, num_beams=num_beams, use_cache=use_cache)
            ids = translator.source_ids(sources)
            translator.translate_ids(ids[:2], batch_size)  # traces the decoder
            _, seconds = translator.translate_ids(ids, batch_size)
            name = f"{'greedy' if num_beams == 1 else f'beam {beams}'}, " \
                   f"{'cache' if use_cache else 'no cache'}"
            speeds[name] = round(len(sources) / seconds, 2)
    return speeds


def section_markdown(rows, speeds, speed_sentences, picture, cpu):
    lines = [
        "## Translation: Multi30k German → English (test2016)", "",
        "Made by `python training/run_translation_results.py` from the runs of "
        "`keras-attn train training/multi30k_transformer.yaml` and "
        "`training/multi30k_rnn.yaml`; BLEU is sacreBLEU on the detokenized, cased output "
        "against the raw references of `test_2016_flickr` (beam search through the "
        f"key/value cache). CPU: {cpu}. Wall time: training and validation (beam search "
        "on the 1,014 validation sentences after every epoch).", "",
        "| model | run / checkpoint | parameters | test2016 BLEU | epochs (best) | "
        "validation BLEU per epoch | training tokens/s (last epoch) | training time | "
        "wall time | CPUs |",
        "| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        bleu = "—" if row["test_bleu"] is None else f"{row['test_bleu']:.2f}"
        best = f"{row['epochs']} ({row['best_epoch']}" + (
            f"; average of {row['averaged'][0]}–{row['averaged'][-1]})" if row["averaged"]
            else ")")
        derived = (f" ({row['derived_epochs']} epochs from their rates)"
                   if row["derived_epochs"] else "")
        training = f"{row['train_minutes']:.0f} min" + (
            f" ({row['epochs']} × {row['epoch_seconds']:g} s)" if "epoch_seconds" in row
            else "")
        wall = "—" if row["wall_minutes"] is None else f"{row['wall_minutes']:.0f} min{derived}"
        lines.append(
            f"| {row['model']} | {row['label']} | {row['parameters']:,} | {bleu} | {best} | "
            f"{', '.join(f'{b:.2f}' for b in row['dev_bleu'])} | "
            f"{row['tokens_per_second']:,.0f} | {training} | {wall} | {row['cpu_count']} |")
    signatures = sorted({row["signature"] for row in rows if row["signature"]})
    lines += ["", f"sacreBLEU signature: `{' / '.join(signatures) or '—'}`", "",
              "Published numbers for this test set (lowercased, tokenized BLEU reads higher "
              "than cased sacreBLEU of the same output):", ""]
    lines += [f"- {entry}" for entry in PUBLISHED]
    lines += ["",
              f"Decoding speed, sentences/s on the first {speed_sentences} test sources "
              "(batches of 64 sorted by length):", "",
              "| model | " + " | ".join(next(iter(speeds.values()))) + " |",
              "| --- |" + " ---: |" * len(next(iter(speeds.values())))]
    for run, values in speeds.items():
        model = next(row["model"] for row in rows if row["run"] == run)
        lines.append(f"| {model} (`{run}`) | " + " | ".join(f"{v:.1f}" for v in values.values())
                     + " |")
    if picture:
        lines += ["", f"Cross-attention of the {rows[0]['model']} translating "
                      f"“{SENTENCE}” (`keras-attn explain {rows[0]['run']} \"{SENTENCE}\"`):",
                  "", f"![alignment]({picture})"]
    return "\n".join(lines) + "\n"


def replace_section(text, section):
    """`text` with `section` between the markers (appended with them if missing)."""
    if BEGIN in text and END in text and text.index(BEGIN) < text.index(END):
        head, rest = text.split(BEGIN, 1)
        return head + BEGIN + "\n" + section + END + rest.split(END, 1)[1]
    return text.rstrip("\n") + "\n\n" + BEGIN + "\n" + section + END + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="finished seq2seq run directories")
    parser.add_argument("--results", default="docs/results.md")
    parser.add_argument("--test-source", default="../shared/data/multi30k/test_2016_flickr.de")
    parser.add_argument("--test-target", default="../shared/data/multi30k/test_2016_flickr.en")
    parser.add_argument("--speed-sentences", type=int, default=200)
    parser.add_argument("--beams", type=int, default=4)
    parser.add_argument("--picture", default="images/translation_alignment.png",
                        help="relative to the results page; '' for none")
    parser.add_argument("--checkpoint", nargs=2, action="append", default=[],
                        metavar=("RUN", "STEP_DIR"),
                        help="also the row of this step checkpoint of RUN (repeatable)")
    parser.add_argument("--epoch-seconds", type=float,
                        help="the checkpoint rows' training time per epoch (e.g. the run's "
                             "epoch measured alone on the machine), instead of their records")
    args = parser.parse_args(argv)
    pairs, _ = read_parallel_files(args.test_source, args.test_target)
    sources = [p.source for p in pairs[: args.speed_sentences]]
    rows = [run_summary(run) for run in args.runs]
    rows += [checkpoint_summary(run, step, pairs, args.epoch_seconds)
             for run, step in args.checkpoint]
    speeds = {run: decoding_speed(run, sources, 64, args.beams) for run in args.runs}
    results = pathlib.Path(args.results)
    if args.picture:
        alignment = Translator.from_run(args.runs[0]).alignment(SENTENCE)
        (results.parent / args.picture).parent.mkdir(parents=True, exist_ok=True)
        plot_attention(results.parent / args.picture, alignment["weights"],
                       alignment["target_tokens"], alignment["source_tokens"],
                       title=f"{SENTENCE}\n-> {alignment['translation']}")
    section = section_markdown(rows, speeds, len(sources), args.picture, cpu_model())
    text = results.read_text(encoding="utf-8") if results.is_file() else "# Results\n"
    results.write_text(replace_section(text, section), encoding="utf-8")
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
