"""Labelled examples of the deployable tasks, tokenized, batched and scored: one
implementation read by the training tasks and by the run contract (`RunDirectory.examples`,
which the quantize and export stages read).

- classification: `ClassificationReader` examples -> `{"token_ids", "segment_ids", "label"}`
  (`[CLS] text [SEP] (pair [SEP])`), scored by accuracy;
- ner: `ConllReader` sentences -> `{"token_ids", "labels", "word_ids", "tags"}` (first-subword
  labels), scored by strict entity F1 (CoNLL-2003 evaluation, seqeval's strict mode).
"""

import numpy as np
import tensorflow as tf

from keras_attn.text.errors import DataError
from keras_attn.text.errors import character_names
from keras_attn.text.ner import align_word_labels
from keras_attn.text.ner import decode_word_labels
from keras_attn.text.ner import entity_scores

ENCODE_CHUNK = 1024
CALIBRATION_SEED = 0
CALIBRATION_BATCH = 8  # examples per batch of calibration data
NOTICE_EXAMPLES = 5  # `file:line`s named in a notice about tokens without a word piece


def encode_texts(examples, tokenizer, labels, path, log):
    """Classification examples as dicts of `token_ids`, `segment_ids` (unpadded) and the
    `label` id (-1 for an unlabelled example).

    Args:
        examples: `ClassificationReader` examples.
        tokenizer: the `WordPieceTokenizer` (its `sequence_length` cuts long texts).
        labels: the `LabelVocabulary` (an unknown label is a `file:line` error).
        path: the file they were read from, for messages.
        log: callable receiving the truncation note.
    """
    encoded, truncated = [], 0
    pairs = bool(examples) and examples[0].text_pair is not None
    for start in range(0, len(examples), ENCODE_CHUNK):
        chunk = examples[start: start + ENCODE_CHUNK]
        for column in ("text", "text_pair") if pairs else ("text",):
            _check_texts_have_pieces(chunk, column, tokenizer, path)
        out = tokenizer([e.text for e in chunk], [e.text_pair for e in chunk] if pairs else None,
                        return_num_truncated=True)
        lengths = out["padding_mask"].numpy().sum(axis=1)
        token_ids, segment_ids = out["token_ids"].numpy(), out["segment_ids"].numpy()
        truncated += int((out["num_truncated"].numpy() > 0).sum())
        for row, example in enumerate(chunk):
            n = lengths[row]
            label = labels.id(example.label, path, example.line) \
                if example.label is not None else -1
            encoded.append({"token_ids": token_ids[row, :n],
                            "segment_ids": segment_ids[row, :n], "label": label})
    if truncated:
        log(f"{path}: {truncated} examples cut by max_length={tokenizer.sequence_length} "
            "(their last word pieces are dropped)")
    return encoded


def encode_sentences(sentences, tokenizer, labels, path, log):
    """CoNLL sentences as dicts of `token_ids`, `labels`, `word_ids`, the gold `tags` and
    `words_without_pieces` (how many of its words became `[UNK]`, below).

    A token the tokenizer turns into no word piece (only whitespace, control or format
    characters, e.g. U+00A0, U+200B or U+FE0F) is kept as the tokenizer's unknown token: its
    tag stays on its word, is trained and is scored. Such tokens are neither dropped nor an
    error; `log` receives one notice per file with their count and first `file:line`s
    (`_no_piece_notice`).

    Args:
        sentences: `ConllReader` sentences.
        tokenizer: the `WordPieceTokenizer` (its `sequence_length` cuts long sentences).
        labels: the `LabelVocabulary` of the tags (an unknown tag is a `file:line` error).
        path: the file they were read from, for messages.
        log: callable receiving the truncation note and the no-piece notice.
    """
    encoded, truncated_words, without_pieces = [], 0, []
    for start in range(0, len(sentences), ENCODE_CHUNK):
        chunk = sentences[start: start + ENCODE_CHUNK]
        # A sentence's words are on consecutive lines from `s.line`.
        label_ids = [[labels.id(tag, path, s.line + offset) for offset, tag in enumerate(s.tags)]
                     for s in chunk]
        pieces = tokenizer.tokenize_words([list(s.tokens) for s in chunk])
        empty = _words_without_pieces(chunk, pieces.row_lengths(axis=2).to_list())
        without_pieces += [word for words in empty for word in words]
        out = align_word_labels(
            pieces, tf.ragged.constant(label_ids, dtype=tf.int32),
            cls_token_id=tokenizer.cls_token_id, sep_token_id=tokenizer.sep_token_id,
            sequence_length=tokenizer.sequence_length,
            unknown_token_id=tokenizer.unknown_token_id)
        truncated_words += int(out["num_truncated_words"].numpy().sum())
        token_ids, word_labels = out["token_ids"].to_list(), out["labels"].to_list()
        word_ids = out["word_ids"].to_list()
        for row, sentence in enumerate(chunk):
            encoded.append({"token_ids": np.asarray(token_ids[row], "int32"),
                            "labels": np.asarray(word_labels[row], "int32"),
                            "word_ids": np.asarray(word_ids[row], "int32"),
                            "tags": list(sentence.tags),
                            "words_without_pieces": len(empty[row])})
    if without_pieces:
        log(_no_piece_notice(path, without_pieces, tokenizer.unknown_token))
    if truncated_words:
        log(f"{path}: {truncated_words} words cut by max_length={tokenizer.sequence_length} "
            "(they count as 'O' predictions)")
    return encoded


def _no_piece_notice(path, words, unknown_token):
    """The one notice about the tokens of a file that yield no word piece.

    Args:
        path: the file.
        words: list of `(line, token)` of those tokens, in file order.
        unknown_token: str, what they are kept as (`"[UNK]"`).

    Returns:
        str: their count, what happens to them, the first `NOTICE_EXAMPLES` as
        `file:line token (character names)` and how many more.

    Example:
    >>> print(_no_piece_notice("dev.txt", [(7, "\\xa0")], "[UNK]"))  # doctest: +ELLIPSIS
    dev.txt: 1 token yields no word piece ... dev.txt:7 '\\xa0' (U+00A0 NO-BREAK SPACE)
    """
    shown = ", ".join(f"{path}:{line} {token!r} ({character_names(token)})"
                      for line, token in words[:NOTICE_EXAMPLES])
    more = len(words) - NOTICE_EXAMPLES
    count = "1 token yields" if len(words) == 1 else f"{len(words)} tokens yield"
    return (f"{path}: {count} no word piece (the tokenizer drops all their characters: "
            "whitespace, control and format characters, and combining marks when it strips "
            f"accents); each is kept as {unknown_token}, so its tag is trained and scored: "
            + shown
            + (f" and {more} more" if more > 0 else ""))


def _check_texts_have_pieces(examples, column, tokenizer, path):
    """A text the tokenizer turns into no word piece (empty, or only whitespace, control or
    format characters such as U+00A0 or U+200B) would be classified from `[CLS] [SEP]`
    alone: a `DataError` at its line."""
    texts = [getattr(e, column) for e in examples]
    counts = tokenizer.tokenize(texts).row_lengths().numpy()
    for example, text, count in zip(examples, texts, counts):
        if count == 0:
            raise DataError(
                path, example.line,
                f"the {column} {text!r} ({character_names(text)}) yields no word piece: it is "
                "empty or the tokenizer drops all its characters (whitespace, control and "
                "format characters), so the example has no text to learn from. Write its "
                "text, or remove the row")


def _words_without_pieces(sentences, piece_counts):
    """For each sentence, `(line, token)` of its tokens that yield no word piece."""
    return [[(sentence.line + offset, sentence.tokens[offset])
             for offset, count in enumerate(counts) if count == 0]
            for sentence, counts in zip(sentences, piece_counts)]


def calibration_sample(examples, count):
    """`count` of `examples` drawn at random (seeded: the same ones every time), in file
    order; all of them when there are fewer.

    A file's first examples can be one document, one source or one length (CoNLL-2003 is in
    document order; SST-2's training phrases come sentence by sentence): a sample of the
    whole file gives activation ranges that fit the whole of it (docs/export.md, "Which
    training examples calibrate")."""
    if count >= len(examples):
        return list(examples)
    return [examples[i] for i in np.sort(_sample_indices(len(examples), count))]


def _sample_indices(total, count):
    """The indices `calibration_sample` picks: `count` of `range(total)`, seeded."""
    return np.random.default_rng(CALIBRATION_SEED).choice(total, count, replace=False)


def not_in_sample(examples, count):
    """The `examples` that `calibration_sample(examples, count)` did not pick, in file order:
    held out from calibration (none when it took them all)."""
    if count >= len(examples):
        return []
    picked = set(_sample_indices(len(examples), count).tolist())
    return [example for i, example in enumerate(examples) if i not in picked]


def id_inputs(examples, length):
    """The model inputs (`token_ids`, `segment_ids`, `padding_mask`, `(B, length)` int32) of
    encoded examples of either task, zero-padded."""
    token_ids = np.zeros((len(examples), length), "int32")
    segment_ids = np.zeros((len(examples), length), "int32")
    for row, example in enumerate(examples):
        n = min(len(example["token_ids"]), length)
        token_ids[row, :n] = example["token_ids"][:n]
        if "segment_ids" in example:
            segment_ids[row, :n] = example["segment_ids"][:n]
    return {"token_ids": token_ids, "segment_ids": segment_ids,
            "padding_mask": (token_ids != 0).astype("int32")}


def score_texts(examples, outputs):
    """Accuracy and mean cross-entropy of per-example `(C,)` logits."""
    logits = np.stack(outputs)
    gold = np.array([e["label"] for e in examples])
    log_probs = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
    return {"accuracy": float((logits.argmax(axis=-1) == gold).mean()),
            "loss": float(-log_probs[np.arange(len(gold)), gold].mean()),
            "examples": len(gold)}


def score_sentences(examples, outputs, labels):
    """Strict entity F1 of per-example outputs: `(S, C)` logits (first-subword argmax) or,
    from a CRF model, dicts with the Viterbi `tags`; with the counts of words cut by the
    length (`words_without_prediction`, tagged `"O"`) and of words scored as `[UNK]`
    (`words_without_pieces`)."""
    gold, predicted, filled, unknown = [], [], 0, 0
    for example, output in zip(examples, outputs):
        scores = output["tags"] if isinstance(output, dict) else output
        n = len(example["token_ids"])
        tags, num_filled = decode_word_labels(np.asarray(scores)[None, :n],
                                              example["word_ids"][None],
                                              [len(example["tags"])], labels)
        filled += num_filled
        unknown += example.get("words_without_pieces", 0)
        gold.append(example["tags"])
        predicted.append(tags[0])
    scores = entity_scores(gold, predicted)
    return {"f1": scores["f1"], "precision": scores["precision"], "recall": scores["recall"],
            "sentences": len(examples), "words_without_prediction": filled,
            "words_without_pieces": unknown,
            "per_type_f1": {k: v["f1"] for k, v in scores["per_type"].items()}}
