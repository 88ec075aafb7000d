"""`keras-attn serve` under slow clients: thousands of idle and half-sent connections held open
while another client sends normal requests.

    python benchmarks/serve_slow_clients.py --out /tmp/serve_slow_clients.md

Exports the sentiment classifier of `serving_batching.py` (MiniLM-L6's shape, random weights),
starts `keras-attn serve` on 127.0.0.1 with its default limits except the two deadlines,
raised to `--hold` seconds so that every attacking connection stays open for the whole
measurement (with the defaults the server closes them after 10 s / 5 s and an attacker has to
keep reopening them), then:

1. baseline: `--requests` one-text predict requests from `--clients` keep-alive clients;
2. opens `--half-sent` connections that send a request line and part of the headers and stop,
   and `--idle` keep-alive connections that get one status answer and then stay idle;
3. the same requests again while all of them are held open.

Reported: status counts, p50 / p99 latency of both phases, whether every answer equals the
baseline answer of its text (label, probabilities within 1e-5), the server's threads and RSS
(largest of samples every 0.2 s, from /proc) and its open connections before and under the
attack, and that no held connection got an answer. Bounded: loopback only, a fixed number of
connections and requests, a timeout on every socket, a deadline on the whole run
(`--deadline`), and the server is stopped at the end.
"""

import argparse
import concurrent.futures
import json
import os
import pathlib
import re
import resource
import select
import socket
import subprocess
import sys
import threading
import time

import numpy as np
from serving_batching import TEXTS
from serving_batching import connect
from serving_batching import export_models
from serving_batching import machine

REPO = pathlib.Path(__file__).resolve().parents[1]
HALF_SENT = b"POST /v1/models/m:predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Len"
STATUS = b"GET /v1/models/m HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


def start_server(saved_model, hold):
    """`(process, port)` of `keras-attn serve` with default limits but the deadlines."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(REPO)}
    process = subprocess.Popen(
        [sys.executable, "-m", "keras_attn.cli", "serve", str(saved_model), "--model-name", "m",
         "--port", "0", "--header-timeout", str(hold), "--keep-alive-timeout", str(hold)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    match = re.search(r"http://127\.0\.0\.1:(\d+)/", process.stdout.readline())
    if not match:
        process.kill()
        raise RuntimeError("keras-attn serve did not start")
    return process, int(match.group(1))


def server_figures(pid):
    """`(threads, RSS MB, open sockets)` of process `pid`, from /proc."""
    status = pathlib.Path(f"/proc/{pid}/status").read_text()
    threads = int(re.search(r"Threads:\s+(\d+)", status).group(1))
    rss = int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) / 1024
    sockets = sum(os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
                  for fd in os.listdir(f"/proc/{pid}/fd"))
    return threads, rss, sockets


class Sampler(threading.Thread):
    """The largest threads / RSS / sockets of the server, sampled every 0.2 s."""

    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid, self.most, self.stop = pid, (0, 0.0, 0), threading.Event()

    def run(self):
        while not self.stop.wait(0.2):
            self.most = tuple(max(a, b) for a, b in zip(self.most, server_figures(self.pid)))


def requests(port, count, clients):
    """`count` one-text predict requests from `clients` keep-alive clients: a list of
    `(text index, status, predictions or None, seconds)`."""
    def client(index):
        connection = connect(port)
        connection.timeout = 30
        results = []
        try:
            for number in range(index, count, clients):
                text = number % len(TEXTS)
                body = json.dumps({"instances": [TEXTS[text]]}).encode("utf-8")
                started = time.perf_counter()
                connection.request("POST", "/v1/models/m:predict", body,
                                   {"Content-Type": "application/json"})
                response = connection.getresponse()
                data = response.read()
                seconds = time.perf_counter() - started
                answer = json.loads(data)["predictions"][0] if response.status == 200 else None
                results.append((text, response.status, answer, seconds))
        finally:
            connection.close()
        return results

    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        return sum(pool.map(client, range(clients)), [])


def wrong_answers(results, expected):
    """Answers that differ from the baseline answer of their text."""
    wrong = 0
    for text, status, answer, _ in results:
        if status != 200:
            continue
        reference = expected[text]
        wrong += answer["label"] != reference["label"] or not np.allclose(
            answer["probabilities"], reference["probabilities"], atol=1e-5)
    return wrong


def hold_connections(port, half_sent, idle, deadline):
    """The attacking sockets: `half_sent` with half a request sent, `idle` keep-alive ones
    that got one status answer."""
    held = []
    for _ in range(half_sent):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(HALF_SENT)
        held.append(sock)
    for _ in range(idle):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(STATUS)
        answer = b""
        while b"model_version_status" not in answer or not answer.endswith(b"}]}"):
            chunk = sock.recv(4096)
            if not chunk or time.monotonic() > deadline:
                raise RuntimeError(f"idle connection: no status answer ({answer[:80]!r})")
            answer += chunk
        held.append(sock)
    return held


def readable(socks):
    """The sockets with something to read (an answer or a close); poll, as select() takes
    no descriptor past 1023."""
    poller = select.poll()
    for sock in socks:
        poller.register(sock, select.POLLIN)
    return poller.poll(0)


def summary(results):
    statuses = {}
    for _, status, _, _ in results:
        statuses[status] = statuses.get(status, 0) + 1
    milliseconds = np.array([r[3] for r in results]) * 1000
    return statuses, float(np.percentile(milliseconds, 50)), float(np.percentile(milliseconds, 99))


def run(args):
    deadline = time.monotonic() + args.deadline
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # our side of the sockets too
    wanted = args.half_sent + args.idle + 256
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))
    path = export_models(args.model_dir)["sentiment"]
    process, port = start_server(path, args.hold)
    held = []
    try:
        requests(port, 16, 4)  # warm-up: the first calls of a SavedModel are slow
        before = requests(port, args.requests, args.clients)
        expected = {text: answer for text, status, answer, _ in before if status == 200}
        if len(expected) != len(TEXTS):
            raise RuntimeError(f"baseline requests failed: {summary(before)[0]}")
        quiet = server_figures(process.pid)
        sampler = Sampler(process.pid)
        sampler.start()
        started = time.monotonic()
        held = hold_connections(port, args.half_sent, args.idle, deadline)
        opened = time.monotonic() - started
        time.sleep(1.0)
        under = server_figures(process.pid)
        attacked = requests(port, args.requests, args.clients)
        answered = readable(held)
        still = server_figures(process.pid)[2]
        sampler.stop.set()
        if time.monotonic() > deadline:
            raise RuntimeError(f"the run passed its --deadline of {args.deadline} s")
        return {"before": summary(before), "attacked": summary(attacked),
                "wrong": wrong_answers(attacked, expected) + wrong_answers(before, expected),
                "quiet": quiet, "under": under, "most": sampler.most, "still_open": still,
                "answered_held": len(answered), "opened_s": opened}
    finally:
        for sock in held:
            sock.close()
        process.terminate()
        process.wait(timeout=30)


def markdown(figures, args, command):
    before, attacked = figures["before"], figures["attacked"]
    quiet, under, most = figures["quiet"], figures["under"], figures["most"]
    lines = [
        f"Command: `{command}`", "",
        f"Machine: {machine()}; load average at the end: "
        f"{', '.join(f'{v:.2f}' for v in os.getloadavg())}.", "",
        "| phase | held open | statuses | p50 ms | p99 ms | server threads | server RSS MB "
        "| server sockets |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |",
        f"| baseline | none | {before[0]} | {before[1]:.1f} | {before[2]:.1f} | {quiet[0]} | "
        f"{quiet[1]:.0f} | {quiet[2]} |",
        f"| attacked | {args.half_sent} half-sent + {args.idle} idle keep-alive | {attacked[0]} "
        f"| {attacked[1]:.1f} | {attacked[2]:.1f} | {under[0]} (most {most[0]}) | "
        f"{under[1]:.0f} (most {most[1]:.0f}) | {under[2]} |", "",
        f"{args.requests} one-text requests per phase from {args.clients} keep-alive clients; "
        f"answers different from the baseline's: {figures['wrong']}; held connections that got "
        f"an answer: {figures['answered_held']}; server sockets still open after the attacked "
        f"phase: {figures['still_open']}; the {args.half_sent + args.idle} connections opened "
        f"in {figures['opened_s']:.1f} s. Every attacked request answered 200 with p99 < 1 s: "
        f"{'yes' if set(attacked[0]) == {200} and attacked[2] < 1000 else 'NO'}.",
    ]
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--half-sent", type=int, default=2000)
    parser.add_argument("--idle", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--hold", type=float, default=120.0,
                        help="the server's --header-timeout and --keep-alive-timeout")
    parser.add_argument("--deadline", type=float, default=600.0,
                        help="seconds for the whole run, the export included")
    parser.add_argument("--model-dir", default="/tmp/sb_models")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    command = "python benchmarks/serve_slow_clients.py " + " ".join(argv or sys.argv[1:])
    text = markdown(run(args), args, command.strip())
    print(text)
    if args.out:
        pathlib.Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
