"""What Python computes for the web library's translation checks (test/translation.test.ts).

Usage:
    python apps/web_demo/tools/translation_reference.py decode OUT.json EXPORT_DIR TEXTS
        [--files translation_fp32.tflite,...]
    python apps/web_demo/tools/translation_reference.py pieces OUT.json TEXTS

`decode`: for each text (one a line of TEXTS) and file of the translation export, on Python
LiteRT (`TranslationFile`, batch 1, the file's card settings): the source ids
(`Translator.source_ids`), the greedy ids (`greedy_decode`) and the beam search ids
(`beam_search` with the card's `num_beams` and `length_penalty`), `target_max_length` each,
the text of the greedy ids (`Translator.text`) and the text `runtime_translator(file).translate`
gives (beam search). `make_test_exports.py` puts this document for the toy export's dev
sources into its `reference.json` (key `translation`), which the browser test reads.

`pieces`: `JoinedWordPieces` over all-MiniLM-L6-v2's vocabulary plus `[JOIN]` (uncased, the
vocabulary of a real BERT model, which covers the texts): the vocabulary, and for each text
its joined piece ids (`encode`) and their text (`decode`).
"""

import argparse
import json
import pathlib
import sys

import numpy as np

from keras_attn.export.tflite.translation_file import TranslationFile
from keras_attn.export.tflite.translation_file import runtime_translator
from keras_attn.text.joined_word_pieces import JOINER_TOKEN
from keras_attn.text.joined_word_pieces import JoinedWordPieces
from keras_attn.text.tokenizer import WordPieceTokenizer
from keras_attn.training.tasks.task import minilm_directory


def decode_reference(export_dir, texts, files):
    document = {"export": str(pathlib.Path(export_dir).resolve()), "files": {}}
    for name in files:
        runtime = TranslationFile(pathlib.Path(export_dir) / name, num_threads=1)
        card = runtime.card
        translator = runtime_translator(runtime)
        settings = dict(bos_token_id=card["bos_token_id"], eos_token_id=card["eos_token_id"],
                        pad_token_id=card["pad_token_id"],
                        max_new_tokens=card["target_max_length"])
        records = []
        for text, source in zip(texts, translator.source_ids(texts)):
            ids = source[None]  # (1, S)
            mask = np.ones_like(ids)
            greedy = runtime.greedy_decode(ids, mask, **settings)
            beam = runtime.beam_search(ids, mask, num_beams=card["num_beams"],
                                       length_penalty=card["length_penalty"], **settings)[0]
            records.append({"text": text, "source_ids": source.tolist(),
                            "greedy": np.asarray(greedy)[0].tolist(),
                            "beam": np.asarray(beam)[0].tolist(),
                            "greedy_translation": translator.text(np.asarray(greedy)[0]),
                            "translation": translator.translate([text])[0]})
        document["files"][name] = {"card": card, "records": records}
    return document


def pieces_reference(texts):
    vocabulary = (pathlib.Path(minilm_directory()) / "vocab.txt").read_text("utf-8").splitlines()
    vocabulary.append(JOINER_TOKEN)
    pieces = JoinedWordPieces(WordPieceTokenizer(vocabulary, lowercase=True))
    records = [{"text": text, "ids": ids.tolist(), "decoded": pieces.decode(ids)}
               for text, ids in zip(texts, pieces.encode(texts))]
    return {"vocabulary": vocabulary, "lowercase": True, "records": records}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    decode = commands.add_parser("decode")
    decode.add_argument("out", type=pathlib.Path)
    decode.add_argument("export_dir", type=pathlib.Path)
    decode.add_argument("texts", type=pathlib.Path)
    decode.add_argument("--files", default="translation_fp32.tflite")
    pieces = commands.add_parser("pieces")
    pieces.add_argument("out", type=pathlib.Path)
    pieces.add_argument("texts", type=pathlib.Path)
    args = parser.parse_args(argv)
    texts = [line for line in args.texts.read_text("utf-8").splitlines() if line]
    if args.command == "decode":
        document = decode_reference(args.export_dir, texts, args.files.split(","))
    else:
        document = pieces_reference(texts)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, ensure_ascii=False), encoding="utf-8")
    print(f"translation reference ({args.command}) -> {args.out}: {len(texts)} texts")


if __name__ == "__main__":
    sys.exit(main())
