"""Per-sentence translation latency of a translation export in headless Chromium and in Python,
side by side in one run: our `.tflite` files (LiteRT.js through the library's
`loadTranslator`; Python LiteRT) against our ONNX encoder + decoder-with-past pair
(onnxruntime-web, the transformers.js route; onnxruntime), at equal beams (issue #53).

    python benchmarks/web_translation_latency.py /work/m30k/export_b \\
        --sources ../shared/data/multi30k/test_2016_flickr.de [--sentences 150] \\
        [--beams 1 4] [--chunk 10] [--warmup 2] [--no-python] [--out /tmp/web_translation.md]

The first `--sentences` sources become source ids in Python (`Translator.source_ids`, the
export's own tokenizer); every route translates those ids, one sentence at a time, 1 thread
(`--threads`), greedy and each of `--beams`:

- Chromium (apps/web_demo/bench/translation.html, built with `vite.bench.config.ts`, served
  and driven as `benchmarks/web_latency.py` does it, wasm from the page's own origin): every
  `translation_*.tflite` file in LiteRT.js (`loadTranslator(...).translateIds`, one
  `decode_step_{S}` call per beam and step), and every `translation_encoder*.onnx` pair in
  onnxruntime-web 1 thread (encoder at the source's own length, all beams of a step in one
  decoder call), both decoded by `src/lib/core/decoding.ts`. The time of a sentence is the
  whole translation.
- Python (`translation_latency.latency`): the same files in LiteRT (XNNPACK; the
  `decode_step_{S}_beams_{K}` signature for all beams at once) and the ONNX pairs in
  onnxruntime, decoded by `keras_attn.generation`.

In each environment the routes take turns by chunks of `--chunk` sentences (the order
rotating per chunk); Python runs first, then the page. Per route and beam width: p50 and
mean ms per sentence, ms per generated token (EOS included), the p50 ratio to the same
environment's onnxruntime dynamic-int8 and fp32 pairs, the file size, the share of sentences
translated into the same tokens (Chromium) or text (Python) as the fp32 `.tflite` file in the
same environment, and (Chromium) the same text as the same file or pair in Python. The goal
lines check the card's default file against onnxruntime-web (p50 ≤ 0.7×) and its size
(< 15 MB). Prints markdown and writes it to `--out` (the raw numbers beside it, `.json`).
Needs Node, `npm ci` in apps/web_demo and Chromium (see web_latency.py).
"""

import argparse
import datetime
import json
import os
import pathlib
import statistics
import sys
import urllib.parse

import numpy as np
import onnxruntime
from translation_latency import latency
from web_latency import CHROMIUM
from web_latency import _package_versions
from web_latency import build_page
from web_latency import check_tools
from web_latency import drive
from web_latency import serve
from web_latency import write_report

from keras_attn.export.onnx.translation_onnx import step_path
from keras_attn.export.tflite.translation_file import TranslationFile
from keras_attn.export.tflite.translation_file import runtime_translator
from keras_attn.machine import cpu_description
from keras_attn.runs.export_directory import CARD_FILE
from keras_attn.text.text_lines import read_lines

ROOT = pathlib.Path(__file__).resolve().parent.parent
SHARED_DATA = pathlib.Path(os.environ.get("KERAS_ATTN_SHARED_DATA")
                           or ROOT.parent / "shared" / "data")
TEST2016 = SHARED_DATA / "multi30k" / "test_2016_flickr.de"
REFERENCE = "translation_fp32.tflite"
DEFAULT_FILE = "translation_int8.tflite"  # when the export's card names none
ORT_INT8, ORT_FP32 = "translation_encoder_dynamic_int8.onnx", "translation_encoder.onnx"
GOAL_RATIO, GOAL_BYTES = 0.7, 15_000_000
ENVIRONMENTS = ("Chromium", "Python")
# The id suffix of the page's route that runs a `.tflite` file's beams in one call.
BEAMS_SIGNATURE = " +beams signature"


def route_files(export):
    """`{route: size in bytes}` of the export's `.tflite` files and ONNX pairs (encoder +
    step)."""
    sizes = {path.name: path.stat().st_size for path in sorted(export.glob("translation_*.tflite"))}
    for path in sorted(export.glob("translation_encoder*.onnx")):
        sizes[path.name] = path.stat().st_size + step_path(path).stat().st_size
    return sizes


def file_of(route):
    """The file (or ONNX encoder) of a route id."""
    return route.removesuffix(BEAMS_SIGNATURE)


def page_job(export, card, sources, beams, args, batched=()):
    """`(files {url: path}, job)` of the translation page; `batched`: the `.tflite` files
    that also run as the page's `litert-beams` route (a step's beams in one call)."""
    files, routes = {}, []
    for k, name in enumerate(route_files(export)):
        path = export / name
        url = f"/models/0/{k}/{name}"
        files[url] = path
        if name.endswith(".tflite"):
            routes.append({"id": name, "runtime": "litert", "url": url})
            if name in batched:
                routes.append({"id": name + BEAMS_SIGNATURE, "runtime": "litert-beams",
                               "url": url})
            continue
        step = step_path(path)
        files[f"/models/0/{k}/{step.name}"] = step
        session = onnxruntime.InferenceSession(str(step), providers=["CPUExecutionProvider"])
        cache = next(i for i in session.get_inputs() if i.name == "self_attention_cache")
        routes.append({"id": name, "runtime": "ort", "url": url,
                       "stepUrl": f"/models/0/{k}/{step.name}",
                       "cacheShape": [int(d) for d in cache.shape[1:]]})
    job = {"threads": args.threads, "warmup": args.warmup, "chunk": args.chunk,
           "beams": beams,
           "card": {"bosTokenId": card["bos_token_id"], "eosTokenId": card["eos_token_id"],
                    "padTokenId": card["pad_token_id"],
                    "targetMaxLength": card["target_max_length"],
                    "lengthPenalty": card["length_penalty"],
                    "sourceLengths": sorted(card["source_lengths"])},
           "sentences": [[int(i) for i in ids] for ids in sources], "routes": routes}
    return files, job


def python_rows(export, texts, beams, args):
    """`{beams: {route: {"ms", "texts", "tokens"}}}` of translation_latency's routes, and the
    source ids and card of the export (from its first translator)."""
    out, sources, card, decode = {}, None, None, None
    for width in beams:
        translators, sources, results = latency(export, texts, width, args.threads, args.chunk)
        first = next(iter(translators.values()))
        card, decode = first.model.card, first.text
        out[width] = {name: {"ms": [1000 * s for s in r["seconds"]], "texts": r["texts"],
                             "tokens": r["tokens"]} for name, r in results.items()}
    return out, sources, card, decode


def browser_rows(page, decode):
    """`{beams: {route: {"ms", "texts", "tokens", "ids"}}}` of the page's result (texts made
    from its ids by the Python tokenizer, tokens counted with EOS)."""
    out = {}
    for block in page["beams"]:
        out[block["beams"]] = {
            route["id"]: {"ms": route["ms"], "ids": route["tokens"],
                          "texts": [decode(ids) for ids in route["tokens"]],
                          "tokens": sum(len(ids) + eos for ids, eos in zip(route["tokens"],
                                                                           route["eos"])),
                          "encode_ms": route["encodeMs"],
                          "step_ms": route["stepMs"]}
            for route in block["routes"]}
    return out


def _same(a, b):
    return sum(x == y for x, y in zip(a, b)) / max(len(a), 1)


def summarize(measured, sizes):
    """Rows of the table: `[(environment, beams, route, stats)]`, with ratios and agreement."""
    rows = []
    for environment in ENVIRONMENTS:
        for width, routes in sorted(measured.get(environment, {}).items()):
            p50 = {name: statistics.median(r["ms"]) for name, r in routes.items()}
            key = "ids" if environment == "Chromium" else "texts"
            for name, r in routes.items():
                twin = measured.get("Python", {}).get(width, {}).get(file_of(name))
                rows.append((environment, width, name, {
                    "p50_ms": p50[name], "mean_ms": statistics.mean(r["ms"]),
                    "ms_per_token": sum(r["ms"]) / max(r["tokens"], 1),
                    "x_ort_int8": p50[name] / p50[ORT_INT8] if ORT_INT8 in p50 else None,
                    "x_ort_fp32": p50[name] / p50[ORT_FP32] if ORT_FP32 in p50 else None,
                    "bytes": sizes.get(file_of(name)),
                    "same_as_fp32_file": _same(r[key], routes[REFERENCE][key])
                    if REFERENCE in routes else None,
                    "same_as_python": _same(r["texts"], twin["texts"])
                    if environment == "Chromium" and twin else None,
                    "sentences": len(r["ms"]),
                    "encode_mean_ms": statistics.mean(r["encode_ms"]) if "encode_ms" in r
                    else None,
                    # Time outside the model calls (search, logits, cache copies): the page's
                    # own adapters only (the library's translator runs its steps itself).
                    "outside_mean_ms": statistics.mean(
                        t - e - st for t, e, st in zip(r["ms"], r["encode_ms"], r["step_ms"]))
                    if None not in r.get("step_ms", [None]) else None}))
    return rows


def _cell(value, spec, suffix=""):
    return "—" if value is None else f"{value:{spec}}{suffix}"


def markdown(report):
    """Header lines, the table, the goal lines, the agreement of the fp32 routes."""
    lines = [f"CPU: {report['cpu']}, {report['cores']} cores, {report['threads']} thread; "
             f"Chromium {report['chromium']} (headless, `--no-sandbox`); "
             + ", ".join(f"{k} {v}" for k, v in report["packages"].items())
             + f"; {report['date']}; {report['sentences']} sentences of `{report['sources']}` "
             f"(source pieces + [SEP]: median {report['source_median']:.0f}, max "
             f"{report['source_max']}); load average {report['load_before']:.2f} before, "
             f"{report['load_after']:.2f} after; wasm: "
             + ", ".join(f"`{name}`" for name in report["wasm_files"]) + ".", "",
             "| runtime | beams | route | p50 ms / sentence | mean | ms / token | "
             "× ORT int8 | × ORT fp32 | size MB | same as fp32 file | same as Python |",
             "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    runtime = {("Chromium", True): "LiteRT.js", ("Chromium", False): "onnxruntime-web",
               ("Python", True): "LiteRT (Python)", ("Python", False): "onnxruntime (Python)"}
    for environment, width, name, s in report["rows"]:
        label = runtime[environment, file_of(name).endswith(".tflite")]
        lines.append(
            f"| {label} | {width} | `{name}` | {s['p50_ms']:.1f} | {s['mean_ms']:.1f} | "
            f"{s['ms_per_token']:.2f} | {_cell(s['x_ort_int8'], '.2f')} | "
            f"{_cell(s['x_ort_fp32'], '.2f')} | {_cell(s['bytes'] and s['bytes'] / 1e6, '.2f')} | "
            f"{_cell(s['same_as_fp32_file'] and 100 * s['same_as_fp32_file'], '.1f', ' %')} | "
            f"{_cell(s['same_as_python'] and 100 * s['same_as_python'], '.1f', ' %')} |")
    return "\n".join(lines + [""] + goal_lines(report)) + "\n"


def goal_lines(report):
    """The default file in Chromium against onnxruntime-web at each beam width (p50 ≤ 0.7×),
    its size (< 15 MB), and how often the fp32 file and the fp32 ONNX pair agree."""
    default = report["default_file"]
    lines = []
    for environment, width, name, s in report["rows"]:
        if environment == "Chromium" and file_of(name) == default \
                and s["x_ort_int8"] is not None:
            verdict = "met" if max(s["x_ort_int8"], s["x_ort_fp32"] or 0) <= GOAL_RATIO \
                else "not met"
            lines.append(f"- {width} beam(s): `{name}` in LiteRT.js p50 {s['p50_ms']:.1f} ms, "
                         f"{s['x_ort_int8']:.2f}× onnxruntime-web's dynamic-int8 pair, "
                         f"{_cell(s['x_ort_fp32'], '.2f')}× its fp32 pair (goal ≤ "
                         f"{GOAL_RATIO:g}× the faster pair: {verdict}).")
    size = report["sizes"].get(default)
    if size is not None:
        lines.append(f"- `{default}` is {size / 1e6:.2f} MB (goal < {GOAL_BYTES / 1e6:g} MB: "
                     f"{'met' if size < GOAL_BYTES else 'not met'}).")
    for environment, width, name, s in report["rows"]:
        if s.get("outside_mean_ms") is not None:
            lines.append(f"- {environment}, {width} beam(s), `{name}`: mean {s['mean_ms']:.1f} "
                         f"ms = encoder {s['encode_mean_ms']:.1f} + decoder steps "
                         f"{s['mean_ms'] - s['encode_mean_ms'] - s['outside_mean_ms']:.1f} + "
                         f"search and glue {s['outside_mean_ms']:.1f}.")
    for environment, width, name, s in report["rows"]:
        if name == ORT_FP32 and s["same_as_fp32_file"] is not None:
            lines.append(f"- {environment}, {width} beam(s): the fp32 ONNX pair translates "
                         f"{100 * s['same_as_fp32_file']:.1f} % of the sentences as the fp32 "
                         "`.tflite` file does"
                         + (" (same tokens)." if environment == "Chromium" else " (same text)."))
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("export", type=pathlib.Path, help="a translation export directory")
    parser.add_argument("--sources", type=pathlib.Path, default=TEST2016,
                        help="source sentences, one per line (default: test2016 German)")
    parser.add_argument("--sentences", type=int, default=150)
    parser.add_argument("--beams", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--chunk", type=int, default=10, help="sentences per route per turn")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--beams-signature", nargs="*", default=None, metavar="FILE",
                        help="`.tflite` files that also run in the page with a step's beams "
                             "in one decode_step_{S}_beams_{K} call (default: the card's "
                             "default file)")
    parser.add_argument("--no-python", dest="python", action="store_false",
                        help="the page only (the Python routes still give the source ids)")
    parser.add_argument("--out", help="the markdown report (FILE.md; FILE.json beside it)")
    parser.add_argument("--chromium", default=CHROMIUM)
    parser.add_argument("--node", default="node")
    parser.add_argument("--no-build", dest="build", action="store_false",
                        help="use dist-bench/ as built")
    parser.add_argument("--page-timeout", type=float, default=3600.0, help="seconds")
    args = parser.parse_args(argv)
    if min(args.sentences, args.chunk, args.threads, *args.beams) < 1 or args.warmup < 0:
        parser.error("--sentences, --chunk, --threads and --beams must be >= 1, --warmup >= 0")
    missing = check_tools(args.node, args.chromium)
    if missing:
        parser.error("missing: " + "; ".join(missing))
    load_before = os.getloadavg()[0]
    texts = [line for _, line in read_lines(args.sources)][:args.sentences]
    sizes = route_files(args.export)
    if REFERENCE not in sizes or ORT_INT8 not in sizes:
        parser.error(f"{args.export}: {REFERENCE} and {ORT_INT8} expected (keras-attn export "
                     "of a seq2seq run)")
    if args.python:
        python, sources, card, decode = python_rows(args.export, texts, args.beams, args)
    else:
        python, translator = {}, runtime_translator(TranslationFile(args.export / REFERENCE))
        sources, card, decode = (translator.source_ids(texts), translator.model.card,
                                 translator.text)
    default_file = json.loads((args.export / CARD_FILE).read_text("utf-8")).get(
        "default_file", DEFAULT_FILE) if (args.export / CARD_FILE).is_file() else DEFAULT_FILE
    if args.build:
        build_page(args.node)
    batched = [default_file] if args.beams_signature is None else args.beams_signature
    files, job = page_job(args.export, card, sources, args.beams, args, batched)
    server, origin = serve(files, {"0.json": json.dumps(job).encode("utf-8")})
    try:
        (page,), chromium = drive(args.node, args.chromium, origin, [(None, "0.json")],
                                  args.page_timeout, page="translation.html")
    finally:
        server.shutdown()
    if page["error"]:
        raise SystemExit(f"the page failed: {page['error']}")
    measured = {"Chromium": browser_rows(page["result"], decode), "Python": python}
    lengths = [len(ids) for ids in sources]
    report = {
        "date": datetime.date.today().isoformat(), "cpu": cpu_description(),
        "cores": os.cpu_count(), "threads": args.threads, "chromium": chromium,
        "packages": {k: v for k, v in _package_versions().items() if "mediapipe" not in k},
        "environment": page["result"]["environment"], "sources": str(args.sources),
        "sentences": len(sources), "source_median": float(np.median(lengths)),
        "source_max": int(max(lengths)), "default_file": default_file,
        "load_before": load_before, "load_after": os.getloadavg()[0],
        "page_load_average": (page["loadBefore"], page["loadAfter"]),
        "loaded": page["result"]["routes"], "sizes": sizes,
        "rows": summarize(measured, sizes),
        "command": " ".join(["python", "benchmarks/web_translation_latency.py",
                             *(argv if argv is not None else sys.argv[1:])]),
        "console_errors": sorted({e for e in page["consoleErrors"]
                                  if not e.startswith(("INFO:", "WARNING:"))}),
        "blocked": page["blocked"],
        "wasm_files": sorted({pathlib.PurePosixPath(urllib.parse.urlsplit(r["url"]).path).name
                              for r in page["requests"] if r["url"].endswith(".wasm")}),
        "measured": measured,
    }
    write_report(markdown(report), report, args.out)
    return report


if __name__ == "__main__":
    main()
