"""What Python computes for the web library's generation checks (test/generation.test.ts,
e2e/generate.spec.ts).

Usage:
    python apps/web_demo/tools/generation_reference.py OUT.json EXPORT_DIR
        [--files generation_fp32.tflite,...] [--prompts PROMPTS.json]

For each prompt (PROMPTS.json: a JSON list of strings, which may hold line ends; default
`PROMPTS` below) and file of a language model
export (`keras-attn export` of a `causal_lm` run), on Python LiteRT (`file_generator`, batch
1, one `decode_step` call per token): the prompt's ids (`TextCodec.encode`), the greedy ids
`generate_ids` gives with the default number of new tokens (every position the file has
left), their text, and the pieces `generate(..., on_text=...)` streams; and for the first
prompt the file's next-token logits after each of its ids (`GenerationFile.sequence_logits`).
`make_test_exports.py` puts this document for its toy generation export into its
`reference.json` (key `generation`), which the browser test reads.
"""

import argparse
import json
import pathlib
import sys

from keras_attn.export.tflite.generation_file import file_generator

# Prompts for the toy export (tests/test_generation_exporter.py's `toy_run`: rotations of one
# line): on its text, across a line end, one character, one the vocabulary lacks ([UNK]),
# one long enough to leave one position.
PROMPTS = ("to be", "whether tis", "the question ", "nobler in", "mind\nto", "t",
           "is the", "or not that", "be or ", "Zebra in the", "quest",
           "to be or not that is the questi")
FILES = ("generation_fp32.tflite", "generation_int8.tflite")


def generation_reference(export_dir, prompts=PROMPTS, files=FILES):
    document = {"export": str(pathlib.Path(export_dir).resolve()), "prompts": list(prompts),
                "files": {}}
    for name in files:
        generator = file_generator(pathlib.Path(export_dir) / name, num_threads=1)
        runtime = generator.model
        records = []
        for prompt in prompts:
            ids = generator.codec.encode(prompt)
            greedy = generator.generate_ids(ids)
            pieces = []
            text = generator.generate(prompt, on_text=pieces.append)
            records.append({"prompt": prompt, "prompt_ids": ids.tolist(), "greedy": greedy,
                            "text": text, "pieces": pieces})
        first = generator.codec.encode(prompts[0])
        document["files"][name] = {
            "card": runtime.card, "max_length": runtime.max_length, "records": records,
            "logits": {"ids": first.tolist(),
                       "logits": runtime.sequence_logits(first).tolist()}}
    return document


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=pathlib.Path)
    parser.add_argument("export_dir", type=pathlib.Path)
    parser.add_argument("--files", default=",".join(FILES))
    parser.add_argument("--prompts", type=pathlib.Path)
    args = parser.parse_args(argv)
    prompts = json.loads(args.prompts.read_text("utf-8")) if args.prompts else PROMPTS
    document = generation_reference(args.export_dir, prompts, args.files.split(","))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, ensure_ascii=False), encoding="utf-8")
    print(f"generation reference -> {args.out}: {len(prompts)} prompts")


if __name__ == "__main__":
    sys.exit(main())
