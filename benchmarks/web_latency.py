"""Per-sentence latency of the exported models in a browser, side by side with the routes a
web developer would pick instead, in one run.

    python benchmarks/web_latency.py runs/demo/sentiment/export runs/demo/entities/export \\
        [--sentences 200] [--threads 1 2] [--extra NAME:PATH] [--out /tmp/web_latency.md]

Each export directory's task (its `model_card.json`) picks the data: SST-2 dev for a
classifier, CoNLL-2003 test for a tagger (`--sst2`, `--conll`; read in place). `--sentences`
are sampled from it (seed `--seed`) and tokenized here, in Python, with the export's own
tokenizer (`keras_attn.stages.inference.load_predictor`; a tagger's words split as `predict` does),
cut to the card's sequence length; the page receives the token ids and times only the model
call (input tensors made, run, output read). The routes, one page per runtime setting:

- LiteRT.js (`@litertjs/core`, `wasm` accelerator, XNNPACK) on `model_fp32`,
  `model_dynamic_int8`, `model_int8` `.tflite` (padded to the card's length) and their
  `_buckets` twins (the shortest signature that holds the tokens, inputs cut to it), and on
  any `--extra NAME:PATH` file (e.g. buckets from 8 tokens; NAME is the export's name);
- onnxruntime-web (wasm backend) on `model.onnx` and `model_dynamic_int8.onnx` at the
  sentence's exact length, what transformers.js runs; the baseline of the ratios is its
  dynamic-int8 file;
- `@mediapipe/tasks-text`'s TextClassifier on `model_*_mediapipe.tflite` (written with the
  `mediapipe` extra; classifiers only): text in, so its time includes MediaPipe's tokenizer.

Pages: 1 thread (LiteRT.js' relaxed-SIMD build `litert_wasm_internal`), the same with the
build for browsers without relaxed SIMD (`litert_wasm_compat_internal`; `--no-compat` skips
it), and each `--threads` count above 1 (LiteRT.js' threaded build with
`cpuOptions.numThreads`, onnxruntime-web `numThreads`; MediaPipe's wasm has no threads). In a
page, every route is loaded and warmed up (each bucket once), then the sentences run in
chunks of `--chunk`: each chunk on every route in turn, the order rotating per chunk, so a
busy moment of a shared machine hits every route alike; ratios are within a page. Then each
route loads `--load-repeats` times on a cold page (fresh browser context, no HTTP cache):
runtime wasm + model fetch + compile, the first run, and the bytes downloaded.

The page (`apps/web_demo/bench/`, built with `vite.bench.config.ts` to `dist-bench/`) is served
by a server in this script with the headers of cross-origin isolation (COOP/COEP), the
runtimes' wasm from `apps/web_demo/node_modules` on the same origin, and driven by
`bench/drive.mjs` (playwright-core) in Debian's headless Chromium (`--chromium`, run with
`--no-sandbox`). Requests outside the origin are aborted and listed (MediaPipe's usage logger
posts to a Google endpoint). Prints a markdown report and writes it to `--out` (the raw
numbers as JSON beside it, `.json`). Needs Node, `npm ci` in apps/web_demo and Chromium.
"""

import argparse
import datetime
import functools
import http.server
import json
import os
import pathlib
import shutil
import subprocess
import sys
import threading
import urllib.parse

import numpy as np

from keras_attn.machine import cpu_description
from keras_attn.runs import ExportDirectory
from keras_attn.stages.inference.predictor import load_predictor
from keras_attn.text.classification_reader import ClassificationReader
from keras_attn.text.conll_reader import ConllReader
from keras_attn.text.entity_prediction import ner_model_inputs
from keras_attn.text.word_splitter import split_words

ROOT = pathlib.Path(__file__).resolve().parent.parent
WEB = ROOT / "apps" / "web_demo"
DIST = WEB / "dist-bench"
DRIVER = WEB / "bench" / "drive.mjs"
# ../shared/data beside the repository, as the other tools read it (KERAS_ATTN_SHARED_DATA
# overrides it), never a path of one machine.
SHARED_DATA = pathlib.Path(os.environ.get("KERAS_ATTN_SHARED_DATA")
                           or ROOT.parent / "shared" / "data")
SST2 = str(SHARED_DATA / "sst2" / "dev.tsv")
CONLL = str(SHARED_DATA / "conll2003" / "test.txt")
CHROMIUM = "/usr/bin/chromium-headless-shell"
# The files run, in table order: LiteRT.js, onnxruntime-web, MediaPipe.
LITERT_FILES = ("model_fp32.tflite", "model_fp32_buckets.tflite", "model_dynamic_int8.tflite",
                "model_dynamic_int8_buckets.tflite", "model_int8.tflite",
                "model_int8_buckets.tflite")
ORT_FILES = ("model.onnx", "model_dynamic_int8.onnx")
MEDIAPIPE_FILES = ("model_fp32_mediapipe.tflite", "model_int8_mediapipe.tflite")
BASELINE = "ort:model_dynamic_int8.onnx"
REFERENCE = "ort:model.onnx"  # the predictions the others are compared with
DEFAULT_ROUTE = "litert:model_int8_buckets.tflite"
GOAL_ONE_THREAD = 0.7
# Where the page finds each runtime's wasm, and the files served from there (a suffix or a
# whole name).
WASM_FOLDERS = {
    "litert": (WEB / "node_modules" / "@litertjs" / "core" / "wasm", (".js", ".wasm")),
    "ort": (WEB / "node_modules" / "onnxruntime-web" / "dist",
            ("ort-wasm-simd-threaded.mjs", "ort-wasm-simd-threaded.wasm")),
    "mediapipe": (WEB / "node_modules" / "@mediapipe" / "tasks-text" / "wasm", (".js", ".wasm")),
}
PACKAGES = ("@litertjs/core", "onnxruntime-web", "@mediapipe/tasks-text", "@playwright/test")
ISOLATION = {"Cross-Origin-Opener-Policy": "same-origin",
             "Cross-Origin-Embedder-Policy": "require-corp",
             "Cross-Origin-Resource-Policy": "same-origin"}
TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript", ".mjs": "text/javascript",
         ".json": "application/json", ".wasm": "application/wasm"}


# --- sentences ---------------------------------------------------------------------------


def export_name(directory):
    """`runs/demo/sentiment/export` -> `sentiment` (as apps/web_demo/tools/serve.mjs names it)."""
    path = pathlib.Path(directory).resolve()
    return path.parent.name if path.name == "export" else path.name


def sample_texts(path, count, seed=0):
    """`count` texts drawn at random (in file order) from an SST-2 TSV (`sentence` column) or a
    CoNLL-2003 file (a sentence's tokens joined by spaces)."""
    if str(path).endswith(".txt"):
        texts = [" ".join(sentence.tokens) for sentence in ConllReader(path, tag_column=None)]
    else:
        texts = [example.text for example in ClassificationReader(
            path, text_column="sentence", label_column="label")]
    rng = np.random.default_rng(seed)
    picked = rng.choice(len(texts), min(count, len(texts)), replace=False)
    return [texts[i] for i in sorted(picked)]


def token_ids(export_dir, card, texts):
    """The token ids of each text as the export's `predict` feeds them, cut to the card's
    sequence length, without padding: a list of lists of int."""
    artifact = next(export_dir / name for name in ("model.onnx", "model_fp32.tflite")
                    if (export_dir / name).is_file())
    tokenizer = load_predictor(artifact).tokenizer
    if card["task"] == "ner":
        words = [[word for word, _, _ in split_words(text, tokenizer.strip_accents)]
                 for text in texts]
        inputs, _, _ = ner_model_inputs(tokenizer, words)
    else:
        inputs = tokenizer(texts)
    ids = np.asarray(inputs["token_ids"])
    lengths = np.asarray(inputs["padding_mask"]).sum(axis=1)
    return [ids[i, :n].tolist() for i, n in enumerate(lengths)]


# --- routes and the server ---------------------------------------------------------------


def export_routes(export_dir, extras=()):
    """`[(route id, runtime, path)]` of the files the export holds, and of the `extras`
    (`.tflite` paths, ids `litert:extra<i>/<file name>`), in table order."""
    routes = [(f"litert:{name}", "litert", export_dir / name) for name in LITERT_FILES]
    routes += [(f"litert:extra{i}/{pathlib.Path(p).name}", "litert", pathlib.Path(p))
               for i, p in enumerate(extras, 1)]
    routes += [(f"ort:{name}", "ort", export_dir / name) for name in ORT_FILES]
    routes += [(f"mediapipe:{name}", "mediapipe", export_dir / name) for name in MEDIAPIPE_FILES]
    return [route for route in routes if route[2].is_file()]


class _Handler(http.server.BaseHTTPRequestHandler):
    """GET of the page (dist-bench/), the runtimes' wasm (/wasm/<runtime>/), the models
    (/models/<i>/<name>) and the jobs (/jobs/<k>.json), each with the isolation headers."""

    def __init__(self, *args, files, jobs, **kwargs):
        self.files, self.jobs = files, jobs
        super().__init__(*args, **kwargs)

    def log_message(self, *args):  # quiet: the driver reports what failed
        pass

    def _resolve(self, path):
        parts = path.strip("/").split("/")
        if parts[0] == "jobs" and len(parts) == 2:
            return self.jobs.get(parts[1])
        if parts[0] == "models":
            return self.files.get(path)
        if parts[0] == "wasm" and len(parts) == 3 and parts[1] in WASM_FOLDERS:
            folder, allowed = WASM_FOLDERS[parts[1]]
            name = parts[2]
            if any(name.endswith(a) if a.startswith(".") else name == a for a in allowed):
                return folder / name
            return None
        full = (DIST / path.lstrip("/")).resolve()
        return full if full.is_relative_to(DIST.resolve()) else None

    def do_GET(self):
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        target = self._resolve(path)
        if isinstance(target, bytes):
            body, kind = target, TYPES[".json"]
        elif target is not None and pathlib.Path(target).is_file():
            body = pathlib.Path(target).read_bytes()
            kind = TYPES.get(pathlib.Path(target).suffix, "application/octet-stream")
        else:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        for key, value in {**ISOLATION, "Content-Type": kind, "Cache-Control": "no-store",
                           "Content-Length": str(len(body))}.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)


def serve(files, jobs):
    """A threaded HTTP server on 127.0.0.1 (a free port), started; `(server, origin)`."""
    handler = functools.partial(_Handler, files=files, jobs=jobs)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


# --- the run -----------------------------------------------------------------------------


def check_tools(node, chromium):
    """What is missing to run the benchmark (a list of sentences; empty when all is there)."""
    missing = []
    if shutil.which(node) is None:
        missing.append(f"Node ({node}): apt-get install nodejs")
    if not pathlib.Path(chromium).is_file():
        missing.append(f"Chromium ({chromium}): apt-get install chromium-headless-shell")
    for package in PACKAGES:
        if not (WEB / "node_modules" / package / "package.json").is_file():
            missing.append(f"{package}: run `npm ci` in apps/web_demo")
    return missing


def build_page(node):
    """Builds bench/ to dist-bench/ with Vite."""
    vite = WEB / "node_modules" / "vite" / "bin" / "vite.js"
    subprocess.run([node, str(vite), "build", "--config", "vite.bench.config.ts", "--logLevel",
                    "warn"], cwd=WEB, check=True)


def page_configs(threads, compat):
    """`[(name, threads, LiteRT.js build)]` of the latency pages."""
    configs = [("1 thread", 1, "internal")] if 1 in threads else []
    if compat:
        configs.append(("1 thread, compat build", 1, "compat"))
    configs += [(f"{t} threads", t, "threaded") for t in threads if t > 1]
    return configs


def plan(tasks, configs, options):
    """The jobs and the pages to open: `(jobs {name: bytes}, pages [(kind, key, url name)])`."""
    jobs, pages = {}, []

    def add(key, job):
        name = f"{len(jobs)}.json"
        jobs[name] = json.dumps(job).encode("utf-8")
        pages.append((key, name))

    common = dict(warmup=options.warmup, chunk=options.chunk, passes=options.passes)
    for config, threads, build in configs:
        add(("latency", config), dict(mode="latency", threads=threads, litertBuild=build,
                                      tasks=[task["job"] for task in tasks], **common))
    for _ in range(options.load_repeats):
        for task in tasks:
            for route in task["job"]["routes"]:
                job = dict(task["job"], sentences=task["job"]["sentences"][:1], routes=[route])
                add(("load", task["name"], route["id"]),
                    dict(mode="load", threads=1, litertBuild="internal", tasks=[job], **common))
    return jobs, pages


def drive(node, chromium, origin, pages, timeout_s, page="bench.html"):
    """Runs drive.mjs on the pages (`page` of dist-bench/, each with its job); `(list of
    page results, Chromium version)`."""
    document = {"chromium": chromium, "origin": origin,
                "pages": [{"url": f"{origin}/{page}?job=/jobs/{name}",
                           "timeoutMs": int(timeout_s * 1000)} for _, name in pages]}
    done = subprocess.run([node, str(DRIVER)], input=json.dumps(document), text=True,
                          stdout=subprocess.PIPE, cwd=WEB)
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    if done.returncode != 0 or not lines or "chromium" not in lines[-1]:
        raise RuntimeError(f"bench/drive.mjs exited with {done.returncode} after {len(lines)} "
                           "pages (its error is above)")
    return lines[:-1], lines[-1]["chromium"]


# --- the report --------------------------------------------------------------------------


def _bytes_of(requests, prefix):
    return sum(r["bytes"] for r in requests
               if urllib.parse.urlsplit(r["url"]).path.startswith(prefix))


def summarize(tasks, configs, pages, results):
    """Per task and route: latency per page config (p50 / p90 and their ratios to the
    baseline's in the same page), agreement with the reference, cold load and bytes.

    Returns:
        `(summary {task: {"routes": {route id: ...}}}, pages {"wasm_files": {page config:
        [wasm files fetched]}, "load_average": {page config: (before, after)}}, [the failed
        pages, one line each])`.
    """
    by_task = {task["name"]: {"routes": {route["id"]: {"latency": {}, "load": []}
                                         for route in task["job"]["routes"]}}
               for task in tasks}
    problems, wasm_files, load_average = [], {}, {}
    for (key, _), page in zip(pages, results):
        if page["error"]:
            problems.append(f"{key}: {page['error'].splitlines()[0]}")
            continue
        if key[0] == "latency":
            load_average[key[1]] = (page["loadBefore"], page["loadAfter"])
            wasm_files[key[1]] = sorted({pathlib.PurePosixPath(urllib.parse.urlsplit(
                r["url"]).path).name for r in page["requests"] if r["url"].endswith(".wasm")})
            for task in page["result"]["tasks"]:
                for route in task["routes"]:
                    ms = np.asarray(route["ms"])
                    by_task[task["name"]]["routes"][route["id"]]["latency"][key[1]] = {
                        "p50_ms": float(np.median(ms)), "p90_ms": float(np.percentile(ms, 90)),
                        "mean_ms": float(ms.mean()), "runs": int(ms.size),
                        "signature_lengths": route["signatureLengths"],
                        "lengths": route["lengths"], "predictions": route["predictions"],
                        "fetch_ms": route["fetchMs"], "compile_ms": route["compileMs"]}
        else:
            (route,) = page["result"]["tasks"][0]["routes"]
            by_task[key[1]]["routes"][key[2]]["load"].append(dict(
                route, wasm_bytes=_bytes_of(page["requests"], "/wasm/"),
                model_bytes_fetched=_bytes_of(page["requests"], "/models/")))
    for name, task in by_task.items():
        for route_id, route in task["routes"].items():
            for config, stats in route["latency"].items():
                base = task["routes"].get(BASELINE, {}).get("latency", {}).get(config)
                stats["p50_ratio"] = stats["p50_ms"] / base["p50_ms"] if base else None
                stats["p90_ratio"] = stats["p90_ms"] / base["p90_ms"] if base else None
            first = route["latency"].get(configs[0][0]) if configs else None
            reference = task["routes"].get(REFERENCE, {}).get("latency", {}).get(
                configs[0][0]) if configs else None
            route["agreement"] = _agreement(first, reference)
            loads = route["load"]
            if loads:
                route["cold_load"] = {
                    "load_ms": float(np.median([x["loadMs"] for x in loads])),
                    "first_run_ms": float(np.median([x["firstRunMs"] for x in loads])),
                    "wasm_bytes": loads[0]["wasm_bytes"], "model_bytes": loads[0]["modelBytes"]}
    return by_task, {"wasm_files": wasm_files, "load_average": load_average}, problems


def _agreement(stats, reference):
    """Fraction of sentences (classifier) or real tokens (tagger) whose argmax equals the
    reference's."""
    if not stats or not reference:
        return None
    same = total = 0
    for a, b in zip(stats["predictions"], reference["predictions"]):
        a, b = np.atleast_1d(a), np.atleast_1d(b)
        same += int((a == b).sum())
        total += a.size
    return same / total if total else None


def runs_at(route_id, stats, card_length):
    """The lengths a route runs at, e.g. `buckets 16/24 (120/80)`: with the sentences that
    ran on each bucket."""
    if route_id.startswith("ort:"):
        return "exact length"
    lengths = stats["signature_lengths"] if stats else []
    if route_id.startswith("mediapipe:"):
        return f"{card_length} (padded; text in)"
    if len(lengths) > 1:
        counts = [stats["lengths"].count(n) for n in lengths]
        return (f"buckets {'/'.join(str(n) for n in lengths)} "
                f"({'/'.join(str(c) for c in counts)})")
    return f"{lengths[0] if lengths else card_length} (padded)"


def markdown(report):
    """The report as markdown: header lines, one table per task, the goal, the notes."""
    configs = [c[0] for c in report["configs"]]
    lines = [f"CPU: {report['cpu']}, {report['cores']} cores; Chromium {report['chromium']} "
             f"(`{report['chromium_path']}`, headless, `--no-sandbox`); "
             + ", ".join(f"{k} {v}" for k, v in report["packages"].items())
             + f"; {report['date']}; load average {report['load_before']:.2f} before, "
             f"{report['load_after']:.2f} after.", ""]
    for task in report["tasks"]:
        lengths = np.asarray(task["token_counts"])
        lines += [f"**{task['name']}** ({task['task']}, `{task['data']}`, {len(lengths)} "
                  f"sentences, seed {report['seed']}; pieces with [CLS]/[SEP] median "
                  f"{np.median(lengths):.0f}, p90 {np.percentile(lengths, 90):.0f}, max "
                  f"{lengths.max()}; card length {task['sequence_length']}). p50 / p90 ms per "
                  f"sentence; × = p50 over onnxruntime-web dynamic-int8's in the same page.", ""]
        header = "| route | runs at |" + "".join(f" {c} p50 / p90 | × |" for c in configs)
        header += " argmax = ONNX fp32 | cold load ms (first run) | wasm MB | model MB |"
        lines += [header, "| --- | --- |" + " ---: | ---: |" * len(configs)
                  + " ---: | ---: | ---: | ---: |"]
        routes = report["summary"][task["name"]]["routes"]
        for route_id, route in routes.items():
            stats = route["latency"]
            first = next(iter(stats.values()), None)
            row = f"| `{route_id}` | {runs_at(route_id, first, task['sequence_length'])} |"
            for config in configs:
                s = stats.get(config)
                row += (f" {s['p50_ms']:.2f} / {s['p90_ms']:.2f} | {s['p50_ratio']:.2f} |"
                        if s and s["p50_ratio"] is not None else " — | — |")
            agreement = route.get("agreement")
            row += f" {agreement:.4f} |" if agreement is not None else " — |"
            load = route.get("cold_load")
            row += (f" {load['load_ms']:.0f} ({load['first_run_ms']:.1f}) | "
                    f"{load['wasm_bytes'] / 1e6:.2f} | {load['model_bytes'] / 1e6:.2f} |"
                    if load else " — | — | — |")
            lines.append(row)
        lines.append("")
        extras = [f"`{route_id}` is `{path}`" for route_id, path in task.get("files", {}).items()
                  if route_id.startswith("litert:extra")]
        if extras:
            lines += ["; ".join(extras) + ".", ""]
        lines += goal_lines(routes, report["configs"]) + [""]
    lines.append("wasm fetched per page: " + "; ".join(
        f"{config}: {', '.join(f'`{name}`' for name in names)}"
        for config, names in report["wasm_files"].items()) + ".")
    lines.append("1-minute load average before / after each latency page: " + "; ".join(
        f"{config} {a:.2f} / {b:.2f}" for config, (a, b) in report["load_average"].items())
        + ".")
    if report["blocked"]:
        lines.append("Requests outside the origin, aborted: "
                     + "; ".join(f"{n}× `{u}`" for u, n in report["blocked"].items()) + ".")
    if report["console_errors"]:
        lines.append("Console errors: " + "; ".join(f"`{e}`" for e in report["console_errors"]))
    for problem in report["problems"]:
        lines.append(f"Failed: {problem}")
    return "\n".join(lines).rstrip() + "\n"


def goal_lines(routes, configs):
    """Per page config: whether the default route meets the issue's goal against the
    baseline (p50 ≤ 0.7× at 1 thread, ≤ 1× with threads), and the fastest route."""
    default = routes.get(DEFAULT_ROUTE, {}).get("latency", {})
    lines = []
    for config, threads, _ in configs:
        stats = default.get(config)
        if not stats or stats["p50_ratio"] is None:
            continue
        bound = GOAL_ONE_THREAD if threads == 1 else 1.0
        met = "met" if stats["p50_ratio"] <= bound else "not met"
        p50s = {route_id: route["latency"][config]["p50_ms"] for route_id, route in routes.items()
                if config in route["latency"]}
        fastest = min(p50s, key=p50s.get)
        rank = ("the fastest route" if fastest == DEFAULT_ROUTE else
                f"the fastest is `{fastest}` at {p50s[fastest]:.2f} ms")
        lines.append(f"- {config}: `{DEFAULT_ROUTE}` p50 {stats['p50_ms']:.2f} ms, "
                     f"{stats['p50_ratio']:.2f}× onnxruntime-web dynamic int8 "
                     f"(goal ≤ {bound:g}×: {met}); {rank}.")
    return lines


def _package_versions():
    versions = {}
    for package in PACKAGES[:3]:
        path = WEB / "node_modules" / package / "package.json"
        versions[package] = json.loads(path.read_text("utf-8"))["version"]
    return versions


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("exports", nargs="+", help="export directories of `keras-attn export`")
    parser.add_argument("--sentences", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sst2", default=SST2, help="SST-2 dev.tsv (classifiers)")
    parser.add_argument("--conll", default=CONLL, help="CoNLL-2003 test.txt (taggers)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--no-compat", dest="compat", action="store_false",
                        help="skip the page on LiteRT.js' build without relaxed SIMD")
    parser.add_argument("--chunk", type=int, default=20, help="sentences per route per turn")
    parser.add_argument("--passes", type=int, default=1, help="times each sentence runs")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--load-repeats", type=int, default=3, help="cold loads per route")
    parser.add_argument("--extra", action="append", default=[], metavar="NAME:PATH",
                        help="another .tflite for the export named NAME (e.g. finer buckets)")
    parser.add_argument("--out", help="the markdown report (FILE.md; FILE.json beside it)")
    parser.add_argument("--chromium", default=CHROMIUM)
    parser.add_argument("--node", default="node")
    parser.add_argument("--no-build", dest="build", action="store_false",
                        help="use dist-bench/ as built")
    parser.add_argument("--page-timeout", type=float, default=600.0, help="seconds per page")
    args = parser.parse_args(argv)
    for name in ("sentences", "chunk", "passes"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.load_repeats < 0 or args.warmup < 0 or min(args.threads) < 1:
        parser.error("--load-repeats and --warmup must be >= 0, --threads >= 1")
    missing = check_tools(args.node, args.chromium)
    if missing:
        parser.error("missing: " + "; ".join(missing))
    extras = {}
    for item in args.extra:
        name, _, path = item.partition(":")
        if not path or not pathlib.Path(path).is_file():
            parser.error(f"--extra {item}: give NAME:PATH of an existing .tflite file")
        extras.setdefault(name, []).append(path)
    load_before = os.getloadavg()[0]

    tasks, files = [], {}
    for index, directory in enumerate(args.exports):
        directory = pathlib.Path(directory)
        card = ExportDirectory(directory).card()
        data = args.conll if card["task"] == "ner" else args.sst2
        texts = sample_texts(data, args.sentences, args.seed)
        ids = token_ids(directory, card, texts)
        name = export_name(directory)
        routes, paths = [], {}
        for k, (route_id, runtime, path) in enumerate(export_routes(
                directory, extras.pop(name, ()))):
            url = f"/models/{index}/{k}/{path.name}"
            files[url], paths[route_id] = path, str(path)
            routes.append({"id": route_id, "runtime": runtime, "url": url})
        tasks.append({"name": name, "task": card["task"], "data": str(data),
                      "directory": str(directory), "files": paths,
                      "token_counts": [len(x) for x in ids],
                      "sequence_length": card["sequence_length"],
                      "job": {"name": name, "tagger": card["task"] == "ner",
                              "sequenceLength": card["sequence_length"],
                              "padId": card["tokenizer"]["pad_token_id"],
                              "numLabels": len(card["labels"]),
                              "sentences": [{"ids": x, "text": t} for x, t in zip(ids, texts)],
                              "routes": routes}})
    if extras:
        parser.error(f"--extra names {sorted(extras)} match no export "
                     f"({[t['name'] for t in tasks]})")
    if args.build:
        build_page(args.node)
    configs = page_configs(args.threads, args.compat)
    jobs, pages = plan(tasks, configs, args)
    server, origin = serve(files, jobs)
    try:
        results, chromium_version = drive(args.node, args.chromium, origin, pages,
                                          args.page_timeout)
    finally:
        server.shutdown()
    summary, latency_pages, problems = summarize(tasks, configs, pages, results)
    blocked = {}
    for page in results:
        for request in page["blocked"]:
            blocked[request] = blocked.get(request, 0) + 1
    environment = next((p["result"]["environment"] for p in results if p["result"]), {})
    report = {
        "date": datetime.date.today().isoformat(), "cpu": cpu_description(),
        "cores": os.cpu_count(), "chromium": chromium_version, "chromium_path": args.chromium,
        "packages": _package_versions(), "environment": environment,
        "command": " ".join(["python", "benchmarks/web_latency.py",
                             *(argv if argv is not None else sys.argv[1:])]),
        "load_before": load_before, "load_after": os.getloadavg()[0], "seed": args.seed,
        "configs": configs, "tasks": [{k: v for k, v in t.items() if k != "job"}
                                      for t in tasks],
        "summary": summary, **latency_pages, "blocked": blocked,
        "problems": problems,
        # LiteRT.js prints its INFO / WARNING logs to the console's error stream.
        "console_errors": sorted({e for p in results for e in p["consoleErrors"]
                                  if not e.startswith(("INFO:", "WARNING:"))}),
    }
    write_report(markdown(report), report, args.out)
    return report


def write_report(text, report, out=None):
    """Prints the Markdown `text`; with `out`, writes it there and `report` beside it as
    JSON (`out` with a `.json` suffix)."""
    print(text, end="")
    if out:
        out = pathlib.Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
        out.with_suffix(".json").write_text(json.dumps(report, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
