"""Writes the translation section of docs/results.md from finished Multi30k runs.

    keras-attn train training/multi30k_transformer.yaml      # runs/multi30k_transformer
    keras-attn train training/multi30k_rnn.yaml              # runs/multi30k_rnn
    python training/run_translation_results.py runs/multi30k_transformer runs/multi30k_rnn

For every run: the model, its parameters, test BLEU with the sacreBLEU signature (from the
run's metrics.json), validation BLEU per epoch, training tokens/s, wall time and the CPU;
then decoding speed (sentences/s) on the first `--speed-sentences` test sources, greedy
and beam search, with and without the key/value cache, measured here (the trace of each
decoder is done before the clock starts); and one alignment picture
(`--picture`, the first run's cross-attention for `--sentence`). The section replaces
what is between `<!-- translation:begin -->` and `<!-- translation:end -->` in
`--results` (appended with the markers when they are missing); the rest of the page is
left as it is.
"""

import argparse
import json
import pathlib
import sys

from keras_attn.machine import cpu_model
from keras_attn.text.parallel_corpus import read_parallel_files
from keras_attn.translation import Translator
from keras_attn.visualization import plot_attention

BEGIN, END = "<!-- translation:begin -->", "<!-- translation:end -->"
SENTENCE = "Ein Mann fährt Fahrrad."


def run_summary(run_dir):
    """The row of one run from its metrics.json and model."""
    run = pathlib.Path(run_dir)
    metrics = json.loads((run / "metrics.json").read_text(encoding="utf-8"))
    translator = Translator.from_run(run)
    history = metrics["history"]
    test = metrics.get("test") or {}
    return {
        "run": str(run), "model": type(translator.model).__name__,
        "parameters": translator.model.count_params(),
        "test_bleu": test.get("bleu"), "signature": test.get("bleu_signature"),
        "dev_bleu": [round(h["dev"]["bleu"], 2) for h in history if "dev" in h],
        "best_epoch": metrics["best_epoch"],
        "tokens_per_second": history[-1]["tokens_per_second"] if history else None,
        "train_seconds": metrics["train_seconds_this_process"],
        "wall_seconds": metrics["wall_seconds_this_process"],
        "cpu_count": metrics["machine"]["cpu_count"],
    }


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
        f"key/value cache). CPU: {cpu}.", "",
        "| model | parameters | test2016 BLEU | best epoch | validation BLEU per epoch | "
        "training tokens/s | training time | CPUs |",
        "| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: |",
    ]
    for row in rows:
        bleu = "—" if row["test_bleu"] is None else f"{row['test_bleu']:.2f}"
        lines.append(
            f"| {row['model']} (`{row['run']}`) | {row['parameters']:,} | {bleu} | "
            f"{row['best_epoch']} | {', '.join(f'{b:.2f}' for b in row['dev_bleu'])} | "
            f"{row['tokens_per_second']:,.0f} | {row['train_seconds'] / 60:.1f} min | "
            f"{row['cpu_count']} |")
    signatures = sorted({row["signature"] for row in rows if row["signature"]})
    lines += ["", f"sacreBLEU signature: `{' / '.join(signatures) or '—'}`", "",
              f"Decoding speed, sentences/s on the first {speed_sentences} test sources "
              "(batches of 64 sorted by length):", "",
              "| model | " + " | ".join(next(iter(speeds.values()))) + " |",
              "| --- |" + " ---: |" * len(next(iter(speeds.values())))]
    for row in rows:
        lines.append(f"| {row['model']} | "
                     + " | ".join(f"{v:.1f}" for v in speeds[row["run"]].values()) + " |")
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
    args = parser.parse_args(argv)
    pairs, _ = read_parallel_files(args.test_source, args.test_target)
    sources = [p.source for p in pairs[: args.speed_sentences]]
    rows = [run_summary(run) for run in args.runs]
    speeds = {row["run"]: decoding_speed(row["run"], sources, 64, args.beams) for row in rows}
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
