"""Character and byte vocabularies for character-level language models.

Two kinds, chosen by `model.tokenizer` in a training config:

- `"bytes"`: the UTF-8 bytes of the text; id `0` is `[PAD]`, byte `b` is id `b + 1`
  (257 ids; any text is covered, a non-ASCII character takes 2-4 ids);
- `"characters"`: the distinct characters of the training text, sorted, after `[PAD]` (id 0)
  and `[UNK]` (id 1, any character the training text does not hold).

The vocabulary is saved as `characters.json` in the run directory (a JSON list: `vocab.txt`
cannot hold the newline character, which is a symbol of character-level models).
"""

import json
import pathlib

import numpy as np

from keras_attn import atomic_files

TOKENIZER_KINDS = ("bytes", "characters")
PAD_TOKEN = "[PAD]"
UNKNOWN_TOKEN = "[UNK]"
VOCABULARY_FILE = "characters.json"


class CharacterTokenizer:
    """Text <-> ids over characters or UTF-8 bytes (Al-Rfou et al., 2018; Dai et al., 2019
    model characters and bytes directly).

    Args:
        kind: `"bytes"` or `"characters"`.
        characters: the symbols of a `"characters"` vocabulary (without `[PAD]` and
            `[UNK]`); unused for `"bytes"`.

    Example:
    >>> tokenizer = CharacterTokenizer.from_texts(["abba", "cab"], "characters")
    >>> tokenizer.get_vocabulary()
    ['[PAD]', '[UNK]', 'a', 'b', 'c']
    >>> tokenizer.encode("abz").tolist()
    [2, 3, 1]
    >>> tokenizer.decode([4, 2, 3])
    'cab'
    >>> CharacterTokenizer("bytes").encode("é").tolist()
    [196, 170]
    """

    def __init__(self, kind, characters=None):
        if kind not in TOKENIZER_KINDS:
            raise ValueError(f"`kind` must be one of {list(TOKENIZER_KINDS)}. "
                             f"Received: kind={kind!r}")
        self.kind = kind
        if kind == "bytes":
            self._symbols = [PAD_TOKEN] + [f"<0x{b:02X}>" for b in range(256)]
            return
        characters = list(characters or ())
        bad = [c for c in characters if not isinstance(c, str) or len(c) != 1]
        if bad or len(set(characters)) != len(characters):
            raise ValueError("`characters` must be distinct one-character strings. Received: "
                             f"characters={characters[:20]!r}")
        self._symbols = [PAD_TOKEN, UNKNOWN_TOKEN] + characters
        self._ids = {c: i for i, c in enumerate(self._symbols) if len(c) == 1}
        # Dense lookup for code points below 65536; others go through the dict.
        self._table = np.ones(65536, "int32")
        for c, i in self._ids.items():
            if ord(c) < 65536:
                self._table[ord(c)] = i

    @classmethod
    def from_texts(cls, texts, kind):
        """The tokenizer of `kind` whose characters are those of `texts` (an iterable)."""
        if kind == "bytes":
            return cls("bytes")
        characters = set()
        for text in texts:
            characters.update(text)
        return cls(kind, sorted(characters))

    @property
    def pad_token_id(self):
        return 0

    def vocabulary_size(self):
        return len(self._symbols)

    def get_vocabulary(self):
        return list(self._symbols)

    def encode(self, text):
        """int32 ids of `text`, one per character (or UTF-8 byte)."""
        if self.kind == "bytes":
            return np.frombuffer(text.encode("utf-8"), np.uint8).astype("int32") + 1
        points = np.frombuffer(text.encode("utf-32-le"), "<u4").astype(np.int64)
        ids = self._table[np.minimum(points, 65535)]
        for index in np.nonzero(points >= 65535)[0]:
            ids[index] = self._ids.get(chr(points[index]), 1)
        return ids.astype("int32")

    def decode(self, ids):
        """The text of `ids` (`[PAD]` dropped, `[UNK]` as U+FFFD, invalid UTF-8 replaced)."""
        ids = [int(i) for i in np.asarray(ids).reshape(-1) if int(i) != 0]
        if self.kind == "bytes":
            return bytes(i - 1 for i in ids).decode("utf-8", errors="replace")
        return "".join("\ufffd" if i == 1 else self._symbols[i] for i in ids)

    def to_json(self):
        """The vocabulary as `characters.json`'s text (`{"kind", "symbols"}`)."""
        return json.dumps({"kind": self.kind, "symbols": self._symbols}, ensure_ascii=False)

    @classmethod
    def from_json(cls, text, source="characters.json"):
        """The tokenizer of `to_json`'s text (`source` names it in the error)."""
        try:
            saved = json.loads(text)
            kind, symbols = saved["kind"], saved["symbols"]
        except (ValueError, KeyError, TypeError) as error:
            raise ValueError(f"{source}: not a character vocabulary written by "
                             f"CharacterTokenizer.save ({error}); delete it to learn the "
                             "vocabulary again") from None
        return cls(kind, symbols[2:] if kind == "characters" else None)

    def save(self, directory):
        """Writes `characters.json` (`to_json`) into `directory`."""
        path = pathlib.Path(directory) / VOCABULARY_FILE
        atomic_files.write_text(path, self.to_json())
        return path

    @classmethod
    def load(cls, path):
        """The tokenizer saved in `path` (a `characters.json` or the directory holding it)."""
        path = pathlib.Path(path)
        if path.is_dir():
            path = path / VOCABULARY_FILE
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, ValueError) as error:
            raise ValueError(f"{path}: not a character vocabulary written by "
                             f"CharacterTokenizer.save ({error}); delete it to learn the "
                             "vocabulary again") from None
        return cls.from_json(text, path)
