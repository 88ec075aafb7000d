"""`TextGenerator`: a prompt in, its continuation out, with a causal language model: the
`GPTCausalLM` of a `causal_lm` run, or its exported `.tflite` file
(`keras_attn.export.tflite.generation_file.GenerationFile`).

Both are decoded by the same code, `keras_attn.generation.generate` over the model's
`next_token_logits` callback and `build_cache`: greedy (`y_t = argmax_v z_t[v]`) or sampling
with temperature, top-k and top-p, the uniforms drawn up front from `seed`, so a file whose
logits equal the model's gives the model's tokens for the same seed. `on_text` receives the
text as it is decoded (a character model: one character a step; WordPiece: the growth of the
detokenized text).

`TextCodec` is the run's tokenizer as text <-> ids: a `CharacterTokenizer` (characters or
bytes, `characters.json`) or a `WordPieceTokenizer` (`vocab.txt`, every text ending in the
end-of-text `[SEP]`, which stops generation).
"""

import json
import pathlib

import numpy as np
from keras import ops

from keras_attn import generation
from keras_attn.errors import KerasAttnError
from keras_attn.layers.validation import check_int
from keras_attn.models.gpt_causal_lm import GPTCausalLM
from keras_attn.runs.run_directory import RunDirectory
from keras_attn.text.character_tokenizer import VOCABULARY_FILE as CHARACTERS_FILE
from keras_attn.text.character_tokenizer import CharacterTokenizer
from keras_attn.text.tokenizer import WordPieceTokenizer

GENERATION_TASK = "causal_lm"
WORDPIECE_FILE = "vocab.txt"
UNFINISHED = "\ufffd"  # the decoding of the first bytes of a UTF-8 character


class GenerationError(KerasAttnError, ValueError):
    """A prompt or setting a language model cannot generate with, or not a language model."""


def is_generation_run(path):
    """Whether `path` is a run directory of the `causal_lm` task."""
    config = pathlib.Path(path) / "config.json"
    try:
        return config.is_file() and json.loads(config.read_text("utf-8")).get(
            "task") == GENERATION_TASK
    except (OSError, ValueError):
        return False


class TextCodec:
    """Text <-> ids of a causal language model's tokenizer.

    Args:
        tokenizer: a `CharacterTokenizer`, or a `WordPieceTokenizer` (texts end in `[SEP]`).

    Attributes:
        kind: `"characters"`, `"bytes"` or `"wordpiece"`.
        stop_token_ids: the ids that end a text (`[SEP]` for WordPiece, none for characters).

    Example:
    >>> codec = TextCodec(CharacterTokenizer.from_texts(["to be"], "characters"))
    >>> codec.encode("be to").tolist()
    [3, 4, 2, 6, 5]
    >>> codec.decode([6, 5])
    'to'
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        if isinstance(tokenizer, CharacterTokenizer):
            self.kind, self.stop_token_ids = tokenizer.kind, ()
        else:
            self.kind, self.stop_token_ids = "wordpiece", (tokenizer.sep_token_id,)

    @classmethod
    def from_files(cls, files, kind, lowercase=True):
        """The codec of a run's or a file's vocabulary: `files` maps `characters.json` or
        `vocab.txt` to its bytes."""
        if kind == "wordpiece":
            words = files[WORDPIECE_FILE].decode("utf-8").splitlines()
            return cls(WordPieceTokenizer(words, lowercase=lowercase))
        return cls(CharacterTokenizer.from_json(files[CHARACTERS_FILE].decode("utf-8")))

    @property
    def vocabulary_file(self):
        """The name of the file that holds the vocabulary."""
        return WORDPIECE_FILE if self.kind == "wordpiece" else CHARACTERS_FILE

    def vocabulary_bytes(self):
        """The vocabulary file's content (what `from_files` reads)."""
        if self.kind == "wordpiece":
            return ("\n".join(self.tokenizer.get_vocabulary()) + "\n").encode("utf-8")
        return self.tokenizer.to_json().encode("utf-8")

    def encode(self, text):
        """int32 ids of `text`."""
        if self.kind == "wordpiece":
            return np.asarray(self.tokenizer.tokenize(text), "int32")
        return self.tokenizer.encode(text)

    def decode(self, ids):
        """The text of `ids` (padding dropped)."""
        if self.kind == "wordpiece":
            ids = [int(i) for i in ids]
            return self.tokenizer.detokenize(ids).numpy().decode("utf-8") if ids else ""
        return self.tokenizer.decode(ids)


class TextGenerator:
    """Prompts in, continuations out, with one causal language model.

    Args:
        model: a `GPTCausalLM` or a `GenerationFile` (`next_token_logits`, `build_cache`).
        codec: the model's `TextCodec`.
        max_length: the model's positions (prompt + generated tokens).

    Example:
    >>> from keras_attn.models.gpt_backbone import GPTBackbone
    >>> from keras_attn.models.gpt_causal_lm import GPTCausalLM
    >>> codec = TextCodec(CharacterTokenizer.from_texts(["abc"], "characters"))
    >>> lm = GPTCausalLM(GPTBackbone(vocabulary_size=5, num_layers=1, num_heads=2,
    ...                              hidden_dim=8, intermediate_dim=16,
    ...                              max_sequence_length=16))
    >>> text = TextGenerator(lm, codec, 16).generate("ab", 5, sampler="sample", seed=1)
    >>> len(text) <= 5 and set(text) <= set("abc\ufffd")
    True
    """

    def __init__(self, model, codec, max_length):
        self.model, self.codec, self.max_length = model, codec, max_length

    @classmethod
    def from_run(cls, run_dir):
        """The generator of a finished `causal_lm` run (`model.keras`, its vocabulary)."""
        run = RunDirectory(run_dir)
        if not is_generation_run(run.path):
            raise GenerationError(f"{run.path}: not a run directory of task "
                                  f"{GENERATION_TASK!r}")
        settings = run.tokenizer_settings()
        name = WORDPIECE_FILE if settings.kind == "wordpiece" else CHARACTERS_FILE
        files = {name: run.file(name, "the model's vocabulary").read_bytes()}
        codec = TextCodec.from_files(files, settings.kind, settings.lowercase)
        model = run.load_model()
        if not isinstance(model, GPTCausalLM):
            raise GenerationError(
                f"{run.path} holds a {type(model).__name__}, not a GPTCausalLM (a "
                "quantization-aware run's copy decodes only as a file): export it with "
                f"`keras-attn export {run.path}` and give the export directory")
        return cls(model, codec, model.backbone.max_sequence_length)

    def generate(self, prompt, max_new_tokens=None, on_text=None, **sampling):
        """The continuation of `prompt` (text), without the stop token.

        Args:
            prompt: a non-empty str.
            max_new_tokens: optional int, at most the positions left after the prompt
                (the default).
            on_text: optional callable receiving the text as it is decoded, piece by
                piece (the pieces add up to the returned text).
            **sampling: `sampler`, `seed`, `temperature`, `top_k`, `top_p` of
                `keras_attn.generation.generate`.

        Returns:
            str.
        """
        ids = self.codec.encode(prompt)
        if not len(ids):
            raise GenerationError("the prompt is empty: give at least one character (or word)"
                                  " for the model to continue")
        stream = _TextStream(self.codec, on_text)
        new = self.generate_ids(ids, max_new_tokens, stream.add if on_text else None,
                                **sampling)
        return stream.finish(new)

    def generate_ids(self, ids, max_new_tokens=None, on_token=None, **sampling):
        """The new ids after the prompt `ids` (1-D ints), up to the first stop token
        (excluded); `on_token` receives each new id as it is chosen (the last one when the
        search returns). Arguments as `generate`'s."""
        room = self.max_length - len(ids)
        if room < 1:
            raise GenerationError(
                f"the prompt is {len(ids)} tokens, the model has {self.max_length} positions"
                ": shorten the prompt (its last words carry most of what comes next)")
        max_new_tokens = room if max_new_tokens is None else max_new_tokens
        check_int("max_new_tokens", max_new_tokens, low=1)
        if max_new_tokens > room:
            raise GenerationError(
                f"{max_new_tokens} new tokens after a prompt of {len(ids)} do not fit the "
                f"model's {self.max_length} positions: ask for at most {room}")
        model, calls = self.model, []

        def next_token_logits(token_ids, cache, index):
            if on_token is not None and calls:  # after the prompt: the token just chosen
                on_token(int(ops.convert_to_numpy(token_ids)[0, -1]))
            calls.append(index)
            return model.next_token_logits(token_ids, cache, index)

        prompt = ops.convert_to_tensor(np.asarray(ids)[None], "int32")  # (1, P)
        tokens = generation.generate(
            next_token_logits, prompt, model.build_cache(1, len(ids) + max_new_tokens),
            max_new_tokens, stop_token_ids=self.codec.stop_token_ids, **sampling)
        new = ops.convert_to_numpy(tokens)[0, len(ids):].tolist()
        stops = [i for i, token in enumerate(new) if token in self.codec.stop_token_ids]
        return new[:stops[0]] if stops else new


class _TextStream:
    """Feeds `on_text` the growth of the decoded text, one token at a time (a character
    cut inside its UTF-8 bytes waits for the rest)."""

    def __init__(self, codec, on_text):
        self.codec, self.on_text = codec, on_text
        self.ids, self.text = [], ""

    def add(self, token):
        if token in self.codec.stop_token_ids:
            return
        self.ids.append(token)
        self._emit(self.codec.decode(self.ids), final=False)

    def finish(self, ids):
        """The text of all new `ids`; the rest of it to `on_text`."""
        text = self.codec.decode(ids)
        if self.on_text:
            self._emit(text, final=True)
        return text

    def _emit(self, text, final):
        if not final and text.endswith(UNFINISHED):
            return
        if text.startswith(self.text) and len(text) > len(self.text):
            self.on_text(text[len(self.text):])
            self.text = text
