"""The side files an on-device port is built and checked against: `model_card.json` and
`golden_vectors.jsonl`.

`model_card.json` says everything a phone needs besides the weights: task, labels, the fixed
sequence length, input / output tensors, the tokenizer settings and special ids, and for a CRF
tagger the transition scores. `golden_vectors.jsonl` holds, per text, what the Python reference
path computes from it: word-piece ids and offsets (and for NER the words and the word index of
each piece), the model's logits, and what the app must decode from those logits (label and
probabilities, or word tags and entity spans). A port is right when, from the text and the
recorded logits alone, it reproduces every other field exactly.

Offsets count Unicode code points of the text (Python `str` indices), never UTF-16 units or
UTF-8 bytes; lines are ASCII JSON (`\\uXXXX` escapes, astral characters as surrogate pairs).

Exactness: logits are rounded to 5 decimals and decoded from the rounded values in float64
(argmax; softmax rounded to 6 decimals). CRF tags are the Viterbi path over the card's
transitions (rounded to 6 decimals) in float64 (`viterbi_float64`), so a port that parses the
same numbers as doubles and adds in the same order gets bit-identical scores; the float32
model weights would decode differently only at near-ties.

Used by `keras-attn export` (`run_exporter`) and by the Android demo's
`apps/android_demo/tools/make_golden_vectors.py`.
"""

import json

import numpy as np

from keras_attn import atomic_files
from keras_attn.runs.task_registry import check_deployable
from keras_attn.runs.task_registry import task_spec
from keras_attn.text.entity_prediction import ner_model_inputs
from keras_attn.text.label_vocabulary import LabelVocabulary
from keras_attn.text.ner import decode_word_labels
from keras_attn.text.ner import entity_spans
from keras_attn.text.ner import first_piece_mask
from keras_attn.text.ner import repair_iob2
from keras_attn.text.word_splitter import split_words

LOGIT_DECIMALS = 5
PROBABILITY_DECIMALS = 6


def viterbi_float64(emissions, transitions, start_transitions, end_transitions):
    """Best CRF tag path of one sequence, in float64, in the order the app adds.

        delta_1 = start + E_1,  delta_i[j] = max_k(delta_{i-1}[k] + A[k, j]) + E_i[j],
        y_n = argmax_j(delta_n[j] + end[j]),  y_{i-1} = backpointer_i[y_i]

    Ties go to the lowest tag index (as `keras_attn.layers.crf.viterbi_decode`).

    Args:
        emissions: `(n, K)` scores of the real positions only (n may be 0).
        transitions: `(K, K)`; start_transitions, end_transitions: `(K,)`.

    Returns:
        list of n ints.

    Example:
    >>> viterbi_float64([[2.0, 0.0], [1.0, 0.0]], [[-5.0, 0.0], [0.0, 0.0]], [0, 0], [0, 0])
    [0, 1]
    """
    emissions = np.asarray(emissions, "float64")
    transitions = np.asarray(transitions, "float64")
    start = np.asarray(start_transitions, "float64")
    end = np.asarray(end_transitions, "float64")
    if len(emissions) == 0:
        return []
    delta = start + emissions[0]  # (K,)
    backpointers = []
    for emission in emissions[1:]:
        candidates = delta[:, None] + transitions  # (K_prev, K)
        best = candidates.argmax(axis=0)  # (K,) first maximum: lowest index on ties
        backpointers.append(best)
        delta = candidates[best, np.arange(len(best))] + emission  # (K,)
    tag = int(np.argmax(delta + end))
    path = [tag]
    for best in reversed(backpointers):
        tag = int(best[tag])
        path.append(tag)
    return path[::-1]


def _softmax(logits):
    probabilities = np.exp(logits - logits.max())
    return probabilities / probabilities.sum()


def classification_records(texts, tokenizer, predict, labels):
    """Golden records of a classifier for a batch of texts.

    Args:
        texts: list of str.
        tokenizer: the `WordPieceTokenizer` (its `sequence_length` is the model's).
        predict: callable, dict of int32 `(B, L)` inputs -> `(B, C)` logits.
        labels: list of C label strings.

    Returns:
        list of dicts: `text`, `token_ids` (packed, without padding), `piece_starts` /
        `piece_ends` (code-point offsets of every piece before truncation), `logits`,
        `label`, `probabilities`.
    """
    x = {k: np.asarray(v) for k, v in tokenizer(texts).items()}
    x["padding_mask"] = x["padding_mask"].astype("int32")
    x["segment_ids"] = x["segment_ids"].astype("int32")
    logits = np.asarray(predict(x), "float64").round(LOGIT_DECIMALS)
    ids, starts, ends = tokenizer.tokenize_with_offsets(texts)
    records = []
    for row, text in enumerate(texts):
        n = int(x["padding_mask"][row].sum())
        records.append({
            "text": text, "token_ids": x["token_ids"][row, :n].tolist(),
            "piece_starts": starts[row].numpy().tolist(),
            "piece_ends": ends[row].numpy().tolist(),
            "logits": logits[row].tolist(),
            "label": labels[int(np.argmax(logits[row]))],
            "probabilities": _softmax(logits[row]).round(PROBABILITY_DECIMALS).tolist(),
        })
    return records


def ner_records(texts, tokenizer, predict, labels, crf=None):
    """Golden records of a tagger for a batch of texts.

    Args:
        texts: list of str.
        tokenizer: the `WordPieceTokenizer` (its `sequence_length` is the model's).
        predict: callable, dict of int32 `(B, L)` inputs -> `(B, L, C)` logits (a CRF
            model's emissions; it also receives `label_mask` when `crf` is given).
        labels: list of C IOB2 tags.
        crf: the card's `crf_card_section`, or `None` for argmax decoding.

    Returns:
        list of dicts: `text`, `words` (`[word, start, end]`), `token_ids`, `word_ids`,
        `num_truncated_words`, `logits` (real positions), `word_tags`, `entities`.
    """
    vocabulary = LabelVocabulary(list(labels))
    split = [split_words(text, tokenizer.strip_accents) for text in texts]
    x, word_ids, truncated = ner_model_inputs(
        tokenizer, [[w for w, _, _ in words] for words in split], use_crf=crf is not None)
    logits = np.asarray(predict(x), "float64").round(LOGIT_DECIMALS)
    records = []
    for row, (text, words) in enumerate(zip(texts, split)):
        n = int(x["padding_mask"][row].sum())
        if crf is None:
            scores = logits[row: row + 1]
        else:
            first = np.flatnonzero(first_piece_mask(word_ids[row: row + 1])[0])
            path = viterbi_float64(logits[row, first], crf["transitions"],
                                   crf["start_transitions"], crf["end_transitions"])
            scores = np.zeros(word_ids[row: row + 1].shape, "int64")
            scores[0, first] = path
        tags, _ = decode_word_labels(scores, word_ids[row: row + 1], [len(words)], vocabulary)
        tags, _ = repair_iob2(tags[0])
        records.append({
            "text": text,
            "words": [[w, s, e] for w, s, e in words],
            "token_ids": x["token_ids"][row, :n].tolist(),
            "word_ids": word_ids[row, :n].tolist(),
            "num_truncated_words": int(truncated[row]),
            "logits": logits[row, :n].tolist(),
            "word_tags": tags,
            "entities": [{k: span[k] for k in ("type", "start_char", "end_char", "text")}
                         for span in entity_spans(tags, [(s, e) for _, s, e in words], text)],
        })
    return records


def write_golden_vectors(path, texts, task, tokenizer, predict, labels, crf=None,
                         batch_size=64):
    """Writes `golden_vectors.jsonl`: one ASCII JSON record per text (see the module doc).

    Args:
        path: output file.
        texts: list of str.
        task: one of `task_registry.DEPLOYABLE_TASKS`; a tagger (`TaskSpec.token_labels`)
            gets `ner_records`, the others `classification_records`.
        tokenizer, predict, labels, crf: as in `classification_records` / `ner_records`.
        batch_size: texts per `predict` call.

    Returns:
        int, the number of records.
    """
    check_deployable(task)
    tagger = task_spec(task).token_labels
    with atomic_files.atomic_path(path) as temporary, \
            open(temporary, "w", encoding="utf-8") as f:
        for start in range(0, len(texts), batch_size):
            chunk = list(texts[start: start + batch_size])
            records = (ner_records(chunk, tokenizer, predict, labels, crf) if tagger
                       else classification_records(chunk, tokenizer, predict, labels))
            for record in records:
                # ASCII escapes: texts hold U+2028 and other characters that some line
                # readers split on.
                f.write(json.dumps(record, ensure_ascii=True) + "\n")
    return len(texts)


def read_golden_vectors(path):
    """The records of a `golden_vectors.jsonl` file, as a list of dicts."""
    records = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{number}: not a JSON record ({error})") from None
    return records
