"""Raw text -> entity spans with a token classifier: the Python reference path of NER serving.

    text -> words (`split_words`, BERT's pre-tokenization rules, with code-point offsets)
         -> word pieces (`WordPieceTokenizer.tokenize_words`)
         -> `[CLS] pieces [SEP]` cut to the tokenizer's `sequence_length` (`align_word_labels`)
         -> model -> one tag per word, from its first piece (`decode_word_labels`; argmax of
            the logits, or the CRF's Viterbi path over the first pieces)
         -> `repair_iob2` -> `entity_spans` with each word's character offsets.

The exported SavedModel (`keras_attn.export.serving_module`) runs the same steps in TF ops and
must give the same entities; this module is what it is tested against.
"""

import numpy as np
import tensorflow as tf

from keras_attn.text.batching import PREDICT_BATCH_SIZE
from keras_attn.text.ner import align_word_labels
from keras_attn.text.ner import decode_word_labels
from keras_attn.text.ner import entity_spans
from keras_attn.text.ner import first_piece_mask
from keras_attn.text.ner import repair_iob2
from keras_attn.text.word_splitter import split_words


def ner_model_inputs(tokenizer, word_lists, use_crf=False):
    """Padded model inputs for pre-split sentences, and where each word's first piece is.

    Args:
        tokenizer: `WordPieceTokenizer`; its `sequence_length` is the padded length.
        word_lists: list of B lists of str.
        use_crf: bool. Add the CRF model's `label_mask` input (1 at first pieces).

    Returns:
        `(inputs, word_ids, num_truncated_words)`: dict of int32 `(B, L)` numpy arrays,
        `(B, L)` word index of each position (-1 for specials and padding), and `(B,)` ints.
    """
    length = tokenizer.sequence_length
    if length < 3:
        raise ValueError(
            "Tagging needs a tokenizer `sequence_length` >= 3 ([CLS], a piece, [SEP]). "
            f"Received: sequence_length={length}"
        )
    words = tf.ragged.constant(
        [list(w) for w in word_lists], dtype=tf.string, ragged_rank=1
    ) if word_lists else tf.RaggedTensor.from_row_lengths(tf.zeros([0], tf.string), [])
    aligned = align_word_labels(
        tokenizer.tokenize_words(words),
        cls_token_id=tokenizer.cls_token_id,
        sep_token_id=tokenizer.sep_token_id,
        sequence_length=length,
    )
    shape = [None, length]
    token_ids = aligned["token_ids"].to_tensor(tokenizer.pad_token_id, shape=shape).numpy()
    word_ids = aligned["word_ids"].to_tensor(-1, shape=shape).numpy()
    inputs = {
        "token_ids": token_ids.astype("int32"),
        "segment_ids": np.zeros_like(token_ids, dtype="int32"),
        "padding_mask": aligned["padding_mask"].to_tensor(False, shape=shape).numpy().astype(
            "int32"
        ),
    }
    if use_crf:
        inputs["label_mask"] = first_piece_mask(word_ids).astype("int32")
    return inputs, word_ids, aligned["num_truncated_words"].numpy()


def predict_entities(model, tokenizer, label_vocabulary, texts,
                     batch_size=PREDICT_BATCH_SIZE):
    """Entities in raw texts, with character offsets (code points of each text).

    Words are cut as BERT's basic tokenizer does (`keras_attn.text.word_splitter`, with the
    tokenizer's `strip_accents`); a word whose first piece falls beyond the tokenizer's
    `sequence_length`, or that has no piece, is tagged `"O"` and counted.

    Args:
        model: a `BertTokenClassifier` (with or without CRF).
        tokenizer: the model's `WordPieceTokenizer`.
        label_vocabulary: the model's `LabelVocabulary` of IOB tags (must contain `"O"`).
        texts: list of str.
        batch_size: int. Texts per model call.

    Returns:
        list, one dict per text: `words` (list of `(word, start, end)`), `tags` (IOB2 tags
        after `repair_iob2`, one per word), `entities` (`entity_spans` dicts with `type`,
        `start_word`, `end_word`, `start_char`, `end_char`, `text`), `num_truncated_words`,
        `num_filled_words` (words tagged `"O"` for lack of a piece, truncated included) and
        `num_repairs`.
    """
    if isinstance(texts, str) or not all(isinstance(text, str) for text in texts):
        raise ValueError(
            f"`texts` must be a list of str. Received: texts={type(texts).__name__}"
        )
    if "O" not in label_vocabulary:
        raise ValueError(
            f"The label vocabulary has no 'O' tag. Received: labels={list(label_vocabulary)}"
        )
    use_crf = bool(getattr(model, "use_crf", False))
    results = []
    for begin in range(0, len(texts), batch_size):
        chunk = list(texts[begin:begin + batch_size])
        split = [split_words(text, tokenizer.strip_accents) for text in chunk]
        inputs, word_ids, truncated = ner_model_inputs(
            tokenizer, [[word for word, _, _ in words] for words in split], use_crf
        )
        outputs = model(inputs, training=False)
        scores = outputs["tags"] if use_crf else outputs
        scores = np.asarray(scores)
        for row, (text, words) in enumerate(zip(chunk, split)):
            tags, filled = decode_word_labels(
                scores[row:row + 1], word_ids[row:row + 1], [len(words)], label_vocabulary
            )
            tags, repairs = repair_iob2(tags[0])
            offsets = [(start, end) for _, start, end in words]
            results.append({
                "words": words,
                "tags": tags,
                "entities": entity_spans(tags, offsets, text),
                "num_truncated_words": int(truncated[row]),
                "num_filled_words": filled,
                "num_repairs": repairs,
            })
    return results
