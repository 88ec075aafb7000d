"""WordPiece vocabularies: learn one from text, save it as a BERT `vocab.txt`, load it back.

A vocabulary file holds one token per line, UTF-8, the line number (from 0) being the
token id; continuation pieces carry the `##` prefix. The loader checks everything the
tokenizer relies on (unique tokens, the special tokens present, valid UTF-8) and names the
line of the first problem, because a broken vocabulary otherwise shows up much later as
silently wrong ids.
"""

import os

import tensorflow as tf
from tensorflow_text.tools.wordpiece_vocab import bert_vocab_from_dataset

from keras_attn import atomic_files
from keras_attn.layers.validation import check_positive_int

DEFAULT_RESERVED_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def load_vocabulary(path, special_tokens=DEFAULT_RESERVED_TOKENS):
    """Reads a BERT `vocab.txt` into a list of tokens (index = token id).

    Lines end with `\\n` or `\\r\\n`; nothing else is stripped, so a token may not start
    or end with spaces unintentionally (such a token could never match and is reported).

    Args:
        path: str or path-like, the vocabulary file.
        special_tokens: tokens that must be present (the tokenizer's unknown, padding,
            [CLS], [SEP] and mask tokens). Defaults to BERT's five. Pass `()` to skip.

    Returns:
        list of str, the tokens in file order.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: the file is empty, a line is not UTF-8, a token is empty, has
            surrounding whitespace or repeats an earlier one, or a special token is
            missing. The message names the file and the 1-based line.

    Example:
    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "vocab.txt")
    >>> save_vocabulary(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hi"], path)
    >>> load_vocabulary(path)[-1]
    'hi'
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"Vocabulary file not found: {path!r}. Pass the path of a BERT `vocab.txt` "
            "(one token per line) or a list of tokens."
        )
    with open(path, "rb") as f:
        raw_lines = f.read().split(b"\n")
    if raw_lines and raw_lines[-1] == b"":
        raw_lines.pop()  # the newline that ends the last line does not start a token
    if not raw_lines:
        raise ValueError(f"Vocabulary file {path!r} is empty: it must hold one token per line.")
    tokens = []
    for line_number, raw in enumerate(raw_lines, start=1):
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        try:
            tokens.append(raw.decode("utf-8"))
        except UnicodeDecodeError as error:
            raise ValueError(
                f"{path}:{line_number}: the line is not valid UTF-8 ({error.reason} at byte "
                f"{error.start} of the line: {raw!r}). Re-encode the file as UTF-8."
            ) from None
    check_vocabulary(tokens, special_tokens=special_tokens, path=path)
    return tokens


def save_vocabulary(tokens, path):
    """Writes tokens one per line (UTF-8, `\\n`), the format `load_vocabulary` reads.

    Args:
        tokens: sequence of str, index = token id.
        path: str or path-like; parent directories must exist.

    Raises:
        ValueError: a token is empty, contains a line break, has surrounding whitespace or
            is repeated (the message gives its index).
    """
    tokens = list(tokens)
    check_vocabulary(tokens, special_tokens=())
    atomic_files.write_text(path, "".join(token + "\n" for token in tokens))


def check_vocabulary(tokens, special_tokens=DEFAULT_RESERVED_TOKENS, path=None):
    """Raises `ValueError` unless `tokens` is a usable WordPiece vocabulary.

    Args:
        tokens: list of str, index = token id.
        special_tokens: tokens that must be present.
        path: the file the tokens came from, if any: problems are then located as
            `path:line` (1-based); otherwise by token id.

    Example:
    >>> try:
    ...     check_vocabulary(["[UNK]", "a", "a"], special_tokens=["[UNK]"])
    ... except ValueError as error:
    ...     print(str(error).split(". ")[0])
    token id 2: duplicate token 'a', first seen at token id 1
    """

    def where(index):
        return f"{path}:{index + 1}" if path is not None else f"token id {index}"

    source = f"vocabulary file {path!r}" if path is not None else "vocabulary"
    if not tokens:
        raise ValueError(f"The {source} is empty: it needs at least the special tokens.")
    first_seen = {}
    for index, token in enumerate(tokens):
        if not isinstance(token, str):
            raise ValueError(
                f"{where(index)}: tokens must be str. Received: token={token!r} "
                f"({type(token).__name__})"
            )
        if token == "":
            raise ValueError(f"{where(index)}: empty token. Remove the blank line.")
        if "\n" in token or "\r" in token:
            raise ValueError(f"{where(index)}: token {token!r} contains a line break.")
        if token != token.strip():
            raise ValueError(
                f"{where(index)}: token {token!r} has leading or trailing whitespace; the "
                "tokenizer splits on whitespace, so it could never match."
            )
        if token in first_seen:
            raise ValueError(
                f"{where(index)}: duplicate token {token!r}, first seen at "
                f"{where(first_seen[token])}. Each token must appear once (its position is "
                "its id)."
            )
        first_seen[token] = index
    missing = [token for token in special_tokens if token not in first_seen]
    if missing:
        raise ValueError(
            f"The {source} lacks the special token(s) {missing}. Add them, or pass the "
            "vocabulary's own special tokens to the tokenizer."
        )


def train_wordpiece_vocabulary(
    texts_or_dataset,
    vocabulary_size,
    lowercase=True,
    reserved_tokens=DEFAULT_RESERVED_TOKENS,
    max_token_length=50,
    max_unique_chars=1000,
    min_count=10,
    batch_size=1024,
):
    """Learns a WordPiece vocabulary with tensorflow-text's BERT vocabulary learner.

    The text is split into words exactly as BERT does (whitespace, punctuation, CJK
    characters; with `lowercase`, also lower-cased with accents stripped), words are
    counted, and `tensorflow_text.tools.wordpiece_vocab` finds by binary search the count
    threshold whose greedy top-down WordPiece vocabulary comes closest to
    `vocabulary_size` (Schuster & Nakajima, 2012; Devlin et al., 2019). Every character
    seen often enough is kept, alone and as a `##` continuation, so the vocabulary can
    spell any word made of them.

    Args:
        texts_or_dataset: a list/tuple of str, or a `tf.data.Dataset` of scalar or 1-D
            string tensors.
        vocabulary_size: int, the target size including the reserved tokens. It is a
            target, not a bound: the threshold search stops at the closest size it finds
            (on 2,000 SST-2 sentences, 1,000 gave 894 tokens with `min_count=2` and
            1,062 with `min_count=3`).
        lowercase: bool. Lower-case and strip accents before counting, as BERT uncased
            (use the same setting for the `WordPieceTokenizer`). Defaults to `True`.
        reserved_tokens: tokens placed first, in this order (their ids are 0, 1, ...).
        max_token_length: int, words longer than this (in characters) are not used to
            learn pieces. Defaults to `50`.
        max_unique_chars: int, at most this many distinct single characters are kept.
            Defaults to `1000`.
        min_count: int, the lowest word count the threshold search may go down to
            (the learner's `lower_thresh`). Pieces rarer than the chosen threshold are
            not learned, so a small corpus needs a small value to reach
            `vocabulary_size`. Defaults to `10`.
        batch_size: int, texts per batch when `texts_or_dataset` is a list.

    Returns:
        list of str: the reserved tokens, then the learned tokens.
    """
    check_positive_int("vocabulary_size", vocabulary_size)
    check_positive_int("max_token_length", max_token_length)
    check_positive_int("max_unique_chars", max_unique_chars)
    check_positive_int("min_count", min_count)
    check_positive_int("batch_size", batch_size)
    reserved_tokens = list(reserved_tokens)
    check_vocabulary(reserved_tokens, special_tokens=())
    if vocabulary_size <= len(reserved_tokens):
        raise ValueError(
            f"`vocabulary_size` must exceed the number of reserved tokens "
            f"({len(reserved_tokens)}). Received: vocabulary_size={vocabulary_size}"
        )
    tokens = bert_vocab_from_dataset.bert_vocab_from_dataset(
        _text_dataset(texts_or_dataset, batch_size),
        vocab_size=vocabulary_size,
        reserved_tokens=reserved_tokens,
        bert_tokenizer_params={"lower_case": bool(lowercase)},
        learn_params={
            "max_token_length": max_token_length,
            "max_unique_chars": max_unique_chars,
            "lower_thresh": min_count,
        },
    )
    # The learner keeps characters the tokenizer treats as spaces (U+00A0 in cased text):
    # such a token could never match, so it is dropped rather than failing the check.
    tokens = [t for t in tokens if t in reserved_tokens or t == t.strip()]
    check_vocabulary(tokens, special_tokens=reserved_tokens)
    return tokens


def _text_dataset(texts_or_dataset, batch_size):
    """`texts_or_dataset` as a `tf.data.Dataset` of scalar or 1-D strings (a list of str is
    batched by `batch_size`); a clear error for anything else."""
    if isinstance(texts_or_dataset, tf.data.Dataset):
        spec = texts_or_dataset.element_spec
        if spec.dtype != tf.string or spec.shape.rank not in (0, 1):
            raise ValueError(
                "`texts_or_dataset` must yield scalar or 1-D string tensors. "
                f"Received: element_spec={spec}"
            )
        return texts_or_dataset
    if not isinstance(texts_or_dataset, (list, tuple)):
        raise ValueError(
            "`texts_or_dataset` must be a list of str or a tf.data.Dataset of strings. "
            f"Received: texts_or_dataset={type(texts_or_dataset).__name__}"
        )
    bad = [i for i, text in enumerate(texts_or_dataset) if not isinstance(text, str)]
    if bad:
        raise ValueError(
            f"`texts_or_dataset` must hold str; item {bad[0]} is "
            f"{type(texts_or_dataset[bad[0]]).__name__}. Received: "
            f"texts_or_dataset[{bad[0]}]={texts_or_dataset[bad[0]]!r}"
        )
    if not texts_or_dataset:
        raise ValueError("`texts_or_dataset` is empty. Received: texts_or_dataset=[]")
    return tf.data.Dataset.from_tensor_slices(list(texts_or_dataset)).batch(batch_size)
