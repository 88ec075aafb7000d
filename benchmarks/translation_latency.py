"""Per-sentence translation latency of a translation export's files on Python LiteRT and
onnxruntime, side by side in one run (issue #53's benchmark, the Python half).

    python benchmarks/translation_latency.py runs/multi30k_transformer/export \\
        --sources ../shared/data/multi30k/test_2016_flickr.de [--sentences 200] \\
        [--beams 4] [--threads 1] [--chunk 10] [--out /tmp/translation_latency.md]

Routes: every `translation_*.tflite` file (LiteRT with XNNPACK, batch 1: one decode_step call
per beam row and step) and every `translation_encoder*.onnx` pair (onnxruntime, the
transformers.js route: all beams in one call), each through `Translator` and the same
`keras_attn.generation` search as the Keras model. `--sentences` sources (the first ones of
`--sources`) are translated in chunks of `--chunk`: each chunk by every route in turn, the
order rotating per chunk, so a busy moment of a shared machine hits every route alike; the
ratios are to the ONNX fp32 pair. Per route: p50 and mean ms per sentence, ms per generated
token, and the share of sentences translated as the fp32 `.tflite` file does. Prints a markdown
table (with the CPU) and writes it to `--out`.
"""

import argparse
import pathlib
import statistics
import sys
import time

from keras_attn.export.onnx.translation_onnx import TranslationOnnx
from keras_attn.export.tflite.translation_file import TranslationFile
from keras_attn.export.tflite.translation_file import runtime_translator
from keras_attn.machine import cpu_description
from keras_attn.text.text_lines import read_lines

BASELINE = "translation_encoder.onnx"


def routes(export, beams, threads):
    """`{file name: Translator}` of the export's `.tflite` files and ONNX pairs."""
    found = {}
    for path in sorted(export.glob("translation_*.tflite")):
        found[path.name] = runtime_translator(TranslationFile(path, num_threads=threads),
                                              num_beams=beams)
    for path in sorted(export.glob("translation_encoder*.onnx")):
        found[path.name] = runtime_translator(TranslationOnnx(path, num_threads=threads),
                                              num_beams=beams)
    if BASELINE not in found or "translation_fp32.tflite" not in found:
        raise SystemExit(f"{export}: no translation export (translation_fp32.tflite and "
                         f"{BASELINE} expected; run keras-attn export on a seq2seq run)")
    return found


def measure(translators, sources, chunk):
    """Per route: the seconds of each sentence, its texts and generated token count."""
    names = list(translators)
    results = {name: {"seconds": [], "texts": [], "tokens": 0} for name in names}
    for start in range(0, len(sources), chunk):
        turn = start // chunk
        for name in names[turn % len(names):] + names[:turn % len(names)]:
            translator = translators[name]
            for source in sources[start:start + chunk]:
                translator.generated_tokens = 0
                began = time.perf_counter()
                text = translator.translate_ids([source], batch_size=1)[0][0]
                results[name]["seconds"].append(time.perf_counter() - began)
                results[name]["texts"].append(text)
                results[name]["tokens"] += translator.generated_tokens
    return results


def latency(export, texts, beams, threads, chunk):
    """`(translators, source ids, measure's results)` of every route of `export` on
    `texts`, after a warm-up (the tf.function trace, first runs)."""
    translators = routes(export, beams, threads)
    sources = next(iter(translators.values())).source_ids(texts)
    for translator in translators.values():
        translator.translate_ids(sources[:2], batch_size=1)
    return translators, sources, measure(translators, sources, chunk)


def table(results, reference="translation_fp32.tflite"):
    baseline = statistics.median(results[BASELINE]["seconds"])
    lines = ["| route | p50 ms / sentence | mean | ms / token | x ONNX fp32 (p50) | "
             "same as fp32 file |", "| --- | --- | --- | --- | --- | --- |"]
    for name, result in results.items():
        seconds = result["seconds"]
        same = sum(a == b for a, b in zip(result["texts"], results[reference]["texts"]))
        lines.append(
            f"| `{name}` | {1000 * statistics.median(seconds):.1f} | "
            f"{1000 * statistics.mean(seconds):.1f} | "
            f"{1000 * sum(seconds) / max(result['tokens'], 1):.2f} | "
            f"{statistics.median(seconds) / baseline:.2f} | {100 * same / len(seconds):.1f} % |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export", type=pathlib.Path, help="a translation export directory")
    parser.add_argument("--sources", required=True, help="source sentences, one per line")
    parser.add_argument("--sentences", type=int, default=200)
    parser.add_argument("--beams", type=int, default=None, help="default: the card's")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--chunk", type=int, default=10)
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args(argv)
    texts = [line for _, line in read_lines(args.sources)][:args.sentences]
    translators, sources, results = latency(args.export, texts, args.beams, args.threads,
                                            args.chunk)
    first = next(iter(translators.values()))
    report = (f"{len(sources)} sentences of {args.sources}, {first.num_beams} beams, "
              f"{args.threads} thread(s), one sentence at a time, {cpu_description()}\n\n"
              + table(results) + "\n")
    print(report)
    if args.out:
        args.out.write_text(report, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
