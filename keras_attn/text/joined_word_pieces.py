"""Reversible WordPiece encoding for generated text: BERT word pieces plus a joiner token
where the original had no space, so the decoder's output detokenizes to raw text."""

import numpy as np

from keras_attn.text.tokenizer import WordPieceTokenizer

JOINER_TOKEN = "[JOIN]"

# Texts per tokenizer call: large enough to amortize the kernel, small enough for memory.
_CHUNK = 2048


class JoinedWordPieces:
    """Word pieces of a `WordPieceTokenizer` with a joiner where no space was.

    BERT's pre-tokenization splits punctuation off words ("bike." -> "bike", "."), and
    its detokenizer puts a space between words, so "Ein Mann fährt Fahrrad." comes back as
    "Ein Mann fährt Fahrrad ." and BLEU on detokenized output (sacreBLEU) would count
    every such space as an error. As OpenNMT's joiner annotation, a `[JOIN]` token is
    placed before every word that touched the previous one in the input:

        "A man's T-shirt."  ->  A man [JOIN] ' [JOIN] s T [JOIN] - [JOIN] shirt [JOIN] .

    and `decode` glues a word that follows `[JOIN]` (and a `##` continuation) to the text
    before it, every other word after one space. The round trip gives the text back with
    every run of whitespace (U+00A0 included) as one space, provided no character is
    dropped by the tokenizer or mapped to `[UNK]` (the test checks it on Multi30k).

    Args:
        tokenizer: a `WordPieceTokenizer` whose vocabulary has `joiner_token`.
        joiner_token: str. Defaults to `"[JOIN]"`.

    Example:
    >>> vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[JOIN]", "a", "bike", "."]
    >>> pieces = JoinedWordPieces(WordPieceTokenizer(vocab, lowercase=False))
    >>> pieces.encode(["a bike."])[0].tolist()
    [6, 7, 5, 8]
    >>> pieces.decode([6, 7, 5, 8])
    'a bike.'
    """

    def __init__(self, tokenizer, joiner_token=JOINER_TOKEN):
        if not isinstance(tokenizer, WordPieceTokenizer):
            raise ValueError("`tokenizer` must be a WordPieceTokenizer. "
                             f"Received: tokenizer={type(tokenizer).__name__}")
        vocabulary = tokenizer.get_vocabulary()
        if joiner_token not in vocabulary:
            raise ValueError(
                f"the vocabulary has no joiner token {joiner_token!r}: learn it with "
                f"`reserved_tokens=(..., {joiner_token!r})` (the seq2seq task does). "
                f"Received: a vocabulary of {len(vocabulary)} tokens")
        self.tokenizer = tokenizer
        self.joiner_token = joiner_token
        self.joiner_id = vocabulary.index(joiner_token)
        self._tokens = list(vocabulary)
        self._continuation = np.array([t.startswith("##") for t in vocabulary])

    def encode(self, texts):
        """One int32 array of piece ids (joiners included) per text of `texts`."""
        texts = list(texts)
        out = []
        for start in range(0, len(texts), _CHUNK):
            chunk = texts[start: start + _CHUNK]
            ids, starts, _ = self.tokenizer.tokenize_with_offsets(chunk)
            for text, row_ids, row_starts in zip(chunk, ids.to_list(), starts.to_list()):
                out.append(self._with_joiners(text, row_ids, row_starts))
        return out

    def _with_joiners(self, text, ids, starts):
        joined = []
        for position, (piece, start) in enumerate(zip(ids, starts)):
            touches = position > 0 and start > 0 and not text[start - 1].isspace()
            if touches and not self._continuation[piece]:
                joined.append(self.joiner_id)
            joined.append(piece)
        return np.asarray(joined, "int32")

    def decode(self, ids):
        """The text of piece ids (joiners and `##` glued, padding skipped)."""
        text, glue = [], True
        pad = self.tokenizer.pad_token_id
        for piece in ids:
            piece = int(piece)
            if piece == pad:
                continue
            if piece == self.joiner_id:
                glue = True
                continue
            token = self._tokens[piece]
            if self._continuation[piece]:
                text.append(token[2:])
            else:
                text.append(token if glue else " " + token)
            glue = False
        return "".join(text)
