"""Named-entity recognition around a subword model: label alignment, decoding, BIO repair, metrics.

A word-level tag sequence (CoNLL) meets a subword model in four places:

1. `align_word_labels` (in-graph): each word's tag goes to its FIRST subword; the other subwords,
   `[CLS]` and `[SEP]` get `IGNORE_LABEL` (-100), which the token-classification loss ignores.
2. `decode_word_labels`: the model's prediction at a word's first subword is the word's tag.
3. `repair_iob2` / `entity_spans`: turn predicted tags into valid IOB2 and into entity spans with
   character offsets.
4. `entity_scores`: strict IOB2 entity precision / recall / F1, equal to
   `seqeval.metrics.classification_report(..., mode="strict", scheme=IOB2)` (micro average).

Entity rules. In strict IOB2 an entity is a `B-X` followed by any number of `I-X`; an `I-X` that
does not continue an `X` entity (after `O`, at the start, after another type) belongs to no
entity. `repair_iob2` instead follows the conlleval convention (also seqeval's default, non-strict
mode): such an `I-X` starts a new entity, i.e. `O I-X` -> `O B-X` and `B-X I-Y` -> `B-X B-Y`.
Repairing predictions before scoring gives them conlleval's credit for entities that start with
`I-`; scoring unrepaired predictions is the strict (lower or equal) number.

The code lives in three modules, all of it importable from here: `word_label_alignment` (1, 2),
`iob2` (3) and `entity_metrics` (4).
"""

from keras_attn.text.entity_metrics import entity_scores
from keras_attn.text.iob2 import IOB_TAG
from keras_attn.text.iob2 import Entity
from keras_attn.text.iob2 import entity_spans
from keras_attn.text.iob2 import iob2_entities
from keras_attn.text.iob2 import repair_iob2
from keras_attn.text.iob2 import word_offsets_from_subwords
from keras_attn.text.word_label_alignment import IGNORE_LABEL
from keras_attn.text.word_label_alignment import align_word_labels
from keras_attn.text.word_label_alignment import decode_word_labels
from keras_attn.text.word_label_alignment import first_piece_mask

__all__ = [
    "IGNORE_LABEL",
    "IOB_TAG",
    "Entity",
    "align_word_labels",
    "decode_word_labels",
    "entity_scores",
    "entity_spans",
    "first_piece_mask",
    "iob2_entities",
    "repair_iob2",
    "word_offsets_from_subwords",
]
