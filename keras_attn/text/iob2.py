"""IOB2 tags: the tag check, conlleval's repair, strict entities and their character spans.

In strict IOB2 an entity is a `B-X` followed by any number of `I-X`; an `I-X` that does not
continue an `X` entity (after `O`, at the start, after another type) belongs to no entity.
`repair_iob2` instead follows the conlleval convention (also seqeval's default, non-strict
mode): such an `I-X` starts a new entity, i.e. `O I-X` -> `O B-X` and `B-X I-Y` -> `B-X B-Y`.
"""

import collections
import re

import numpy as np

IOB_TAG = re.compile(r"^(O|[BI]-\S+)$")  # one tag of the IOB1/IOB2 schemes

Entity = collections.namedtuple("Entity", ["type", "start", "end"])
Entity.__doc__ = """An entity over words `[start, end)` (end exclusive) of type `type` (`"PER"`)."""


def _check_tags(tags, where=""):
    for position, tag in enumerate(tags):
        if not isinstance(tag, str) or not IOB_TAG.match(tag):
            raise ValueError(
                f"Malformed tag {tag!r} at position {position}{where}: expected 'O', 'B-<TYPE>' "
                "or 'I-<TYPE>'."
            )


def repair_iob2(tags):
    """Makes a tag sequence valid IOB2 with the conlleval rule: an `I-X` that does not continue
    an `X` entity starts one (`O I-X` -> `O B-X`, `B-X I-Y` -> `B-X B-Y`, `I-X` first -> `B-X`).

    Returns:
        `(repaired_tags, num_repairs)`.

    Example:
    >>> repair_iob2(["O", "I-PER", "I-PER", "B-LOC", "I-ORG"])
    (['O', 'B-PER', 'I-PER', 'B-LOC', 'B-ORG'], 2)
    """
    tags = list(tags)
    _check_tags(tags)
    repaired = []
    previous_type = None
    num_repairs = 0
    for tag in tags:
        if tag.startswith("I-") and tag[2:] != previous_type:
            tag = "B-" + tag[2:]
            num_repairs += 1
        repaired.append(tag)
        previous_type = None if tag == "O" else tag[2:]
    return repaired, num_repairs


def iob2_entities(tags):
    """Entities of a tag sequence under strict IOB2: `B-X` then any `I-X`; other `I-` tags belong
    to no entity.

    Example:
    >>> iob2_entities(["B-PER", "I-PER", "O", "I-LOC", "B-ORG", "I-LOC"])
    [Entity(type='PER', start=0, end=2), Entity(type='ORG', start=4, end=5)]
    """
    tags = list(tags)
    _check_tags(tags)
    entities = []
    start = None
    entity_type = None
    for position, tag in enumerate(tags + ["O"]):
        if start is not None and not (tag.startswith("I-") and tag[2:] == entity_type):
            entities.append(Entity(entity_type, start, position))
            start = None
        if tag.startswith("B-"):
            start, entity_type = position, tag[2:]
    return entities


def entity_spans(tags, word_offsets, text=None):
    """Entities with character offsets, from word tags and each word's `(start, end)` characters.

    Tags are read as strict IOB2 (`repair_iob2` them first for conlleval-style entities).

    Args:
        tags: list of str, one IOB2 tag per word.
        word_offsets: list of `(start_char, end_char)` per word (end exclusive); for subword
            tokenizer output use `word_offsets_from_subwords`.
        text: str or `None`. The original text; with it each span carries its `text`.

    Returns:
        list of dicts `{"type", "start_word", "end_word", "start_char", "end_char"[, "text"]}`
        (`end_*` exclusive).

    Example:
    >>> text = "Peter Blackburn visits Paris"
    >>> offsets = [(0, 5), (6, 15), (16, 22), (23, 28)]
    >>> [span["text"] for span in entity_spans(["B-PER", "I-PER", "O", "B-LOC"], offsets, text)]
    ['Peter Blackburn', 'Paris']
    """
    tags = list(tags)
    if len(tags) != len(word_offsets):
        raise ValueError(
            f"`tags` and `word_offsets` need one entry per word. Received: {len(tags)} tags, "
            f"{len(word_offsets)} offsets"
        )
    spans = []
    for entity in iob2_entities(tags):
        start_char = int(word_offsets[entity.start][0])
        end_char = int(word_offsets[entity.end - 1][1])
        span = {"type": entity.type, "start_word": entity.start, "end_word": entity.end,
                "start_char": start_char, "end_char": end_char}
        if text is not None:
            span["text"] = text[start_char:end_char]
        spans.append(span)
    return spans


def word_offsets_from_subwords(start_chars, end_chars, word_ids, num_words):
    """Character offsets of words from their subwords' offsets: `(start of the first subword,
    end of the last)`; a word with no subword (truncated) gets `None`.

    Args:
        start_chars, end_chars: (S,) character offsets of each subword (the tokenizer's
            `tokenize_with_offsets`, aligned with `word_ids`).
        word_ids: (S,) word index of each subword, `-1` for specials and padding.
        num_words: int. Number of words.

    Example:
    >>> word_offsets_from_subwords([0, 0, 5, 8, 0], [0, 5, 8, 11, 0], [-1, 0, 1, 1, -1], 2)
    [(0, 5), (5, 11)]
    """
    offsets = [None] * int(num_words)
    for start, end, word in zip(np.asarray(start_chars).tolist(), np.asarray(end_chars).tolist(),
                                np.asarray(word_ids).tolist()):
        if word < 0:
            continue
        if offsets[word] is None:
            offsets[word] = (int(start), int(end))
        else:
            offsets[word] = (offsets[word][0], int(end))
    return offsets
