"""The contract of a deployable task's model at its edges: the id inputs it reads, the
longest input it takes, how a CRF tagger's emissions become its tags, and the task head that
decodes and scores its outputs.

Every stage that feeds a classifier or a tagger (export, quantization budget, artifact
scoring, the predictors) reads these from here, so an exported file, a quantized model and
the Keras model are fed and decoded the same way. Imports no pipeline library.
"""

import keras
import numpy as np

from keras_attn.layers.crf import viterbi_decode
from keras_attn.layers.token_and_position_embedding import TokenAndPositionEmbedding
from keras_attn.runs.task_registry import check_deployable
from keras_attn.runs.task_registry import task_spec
from keras_attn.text.labelled_examples import score_sentences
from keras_attn.text.labelled_examples import score_texts
from keras_attn.text.ner import first_piece_mask

# The inputs of a BERT classifier or tagger, in the order of its signature and of its
# exported files (a CRF tagger's Keras model also reads `label_mask`, which only the tags use).
ID_INPUTS = ("token_ids", "segment_ids", "padding_mask")


def max_sequence_length(model):
    """The longest input `model` has positions for (a backbone's `max_sequence_length`, or
    the rows of a `TokenAndPositionEmbedding`'s position table), or `None` without one
    (XLNet's relative positions)."""
    for layer in model._flatten_layers(include_self=False):
        length = getattr(layer, "max_sequence_length", None)
        if isinstance(layer, TokenAndPositionEmbedding):
            length = layer.sequence_length
        if isinstance(length, int):
            return length
    return None


def check_length(length, limit, what, where="the model", fix=None, error=ValueError):
    """Raises unless `length` is at most `limit`, a model's `max_sequence_length`.

    Args:
        length: int, the sequence length asked for.
        limit: int, the longest input the model has positions for, or `None` (no limit).
        what: str, the setting that asked for `length` (`"data.max_length"`).
        where: str, the model the limit is of (`"the model in runs/ner"`).
        fix: str, how to fix it; defaults to `"use at most {limit}"`.
        error: the exception class raised, or a callable taking the message and returning
            the exception (e.g. `lambda message: ConfigError(message, source)`).

    Example:
    >>> check_length(32, 16, "sequence_length", fix="use --sequence-length 16 or less")
    Traceback (most recent call last):
    ...
    ValueError: sequence_length=32 exceeds the max_sequence_length=16 of the model (the rows of its position table): use --sequence-length 16 or less
    """  # noqa: E501
    if limit is None or length <= limit:
        return
    fix = f"use at most {limit}" if fix is None else fix
    raise error(f"{what}={length} exceeds the max_sequence_length={limit} of {where} "
                f"(the rows of its position table): {fix}")


def crf_tags(emissions, crf, mask):
    """Viterbi tags of a CRF tagger's emissions over the positions of `mask`.

    Args:
        emissions: `(B, S, C)` emission scores (the tagger's `logits`), cast to float32.
        crf: the tagger's `CRF` layer (or anything with its `transitions`,
            `start_transitions` and `end_transitions`, e.g. a model card's).
        mask: boolean `(B, S)`, True where a tag is decoded.

    Returns:
        int32 numpy array `(B, S)`, 0 outside `mask`.
    """
    tags = viterbi_decode(np.asarray(emissions, "float32"), crf.transitions,
                          crf.start_transitions, crf.end_transitions, mask=mask)
    return keras.ops.convert_to_numpy(tags)


def crf_word_tags(emissions, crf, word_ids):
    """Viterbi tags of a CRF tagger's emissions over each word's first piece, where a
    word's tag is read (`first_piece_mask(word_ids)`); arguments and result as `crf_tags`,
    with `word_ids` `(B, S)`, the word of each piece (-1 for specials and padding)."""
    return crf_tags(emissions, crf, first_piece_mask(word_ids))


class ClassificationHead:
    """The outputs of a text classifier (`task: classification`): one `(C,)` logits row per
    example, read as they are, scored with `score_texts` (accuracy, loss)."""

    task = "classification"
    metric = task_spec(task).metric  # "accuracy"

    def decode(self, output, example):
        """One example's prediction from its raw output: the `(C,)` logits themselves."""
        return output

    def score(self, examples, outputs):
        """The metrics of per-example predictions (`decode`'s) on labelled `examples`."""
        return score_texts(examples, outputs)


class TaggingHead:
    """The outputs of a tagger (`task: ner`): `(n, C)` logits over an example's `n` pieces,
    or a CRF tagger's emissions, decoded into Viterbi `tags` over each word's first piece;
    scored with `score_sentences` (strict entity F1).

    Args:
        labels: the run's `LabelVocabulary` of IOB tags.
        crf: the tagger's `CRF` layer (or its weights, as a model card's `crf()`), or `None`.
    """

    task = "ner"
    metric = task_spec(task).metric  # "f1"

    def __init__(self, labels, crf=None):
        self.labels, self.crf = labels, crf

    def decode(self, output, example):
        """One example's prediction from its raw `(n, C)` output: the output itself, or for
        a CRF tagger `{"tags": (n,) int32}`."""
        if self.crf is None:
            return output
        return {"tags": crf_word_tags(output[None], self.crf, example["word_ids"][None])[0]}

    def score(self, examples, outputs):
        """The metrics of per-example predictions (`decode`'s) on labelled `examples`."""
        return score_sentences(examples, outputs, self.labels)


def head_for_task(task, labels=None, crf=None):
    """The head of a deployable `task` (`ClassificationHead` or `TaggingHead`, as
    `task_spec(task).token_labels` says), with the run's `labels` and a CRF tagger's `crf`."""
    check_deployable(task)
    return TaggingHead(labels, crf) if task_spec(task).token_labels else ClassificationHead()
