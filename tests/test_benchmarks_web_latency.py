"""benchmarks/web_latency.py: the server's isolation headers and refusals, the report and its
verdicts on made-up page results, and (slow) a real run in headless Chromium on two tiny
exports."""

import json
import math
import urllib.error
import urllib.request

import pytest

from keras_attn.runs.training_config import TrainingConfig
from keras_attn.stages.export_options import ExportOptions
from keras_attn.stages.run_exporter import export_run
from keras_attn.stages.train_stage import Trainer
from tests.exported_runs import QUICK_EXPORT
from tests.exported_runs import ner_config
from tests.scripts import load_script
from tests.test_trainer import config_dict
from tests.test_trainer import write_data

pytestmark = pytest.mark.tensorflow

bench = load_script("benchmarks/web_latency.py", "benchmarks_web_latency")


def _get(url):
    try:
        with urllib.request.urlopen(url) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), b""


def test_the_server_isolates_the_page_and_serves_only_what_it_lists(tmp_path):
    model = tmp_path / "model_int8.tflite"
    model.write_bytes(b"TFL3 bytes")
    server, origin = bench.serve({"/models/0/0/model_int8.tflite": model}, {"0.json": b"{}"})
    try:
        status, headers, body = _get(f"{origin}/models/0/0/model_int8.tflite")
        assert (status, body) == (200, b"TFL3 bytes")
        assert headers["Cross-Origin-Opener-Policy"] == "same-origin"
        assert headers["Cross-Origin-Embedder-Policy"] == "require-corp"
        assert headers["Cache-Control"] == "no-store"
        assert _get(f"{origin}/jobs/0.json")[::2] == (200, b"{}")
        status, headers, _ = _get(f"{origin}/wasm/ort/ort-wasm-simd-threaded.wasm")
        if status == 200:  # node_modules installed
            assert headers["Content-Type"] == "application/wasm"
        for path in ("/models/0/1/model_int8.tflite", "/jobs/1.json", "/wasm/ort/ort.min.js",
                     "/wasm/other/x.wasm", "/../../setup.cfg", "/%2e%2e/%2e%2e/setup.cfg"):
            assert _get(origin + path)[0] == 404, path
    finally:
        server.shutdown()


def _page(ms_by_route, lengths=(16, 24)):
    routes = [{"id": route_id, "signatureLengths": [16, 24], "fetchMs": 1.0, "compileMs": 2.0,
               "ms": ms, "lengths": list(lengths), "predictions": [1, 0]}
              for route_id, ms in ms_by_route.items()]
    return {"error": None, "loadBefore": 0.5, "loadAfter": 0.75,
            "requests": [{"url": "http://h/wasm/litert/litert_wasm_internal.wasm", "bytes": 9}],
            "result": {"tasks": [{"name": "sentiment", "routes": routes}]}}


def test_ratios_agreement_and_the_goal_are_reported():
    ids = [bench.DEFAULT_ROUTE, bench.REFERENCE, bench.BASELINE]
    tasks = [{"name": "sentiment", "task": "classification", "data": "dev.tsv",
              "token_counts": [9, 20], "sequence_length": 24,
              "job": {"routes": [{"id": route_id} for route_id in ids]}}]
    configs = bench.page_configs([1, 2], compat=False)
    assert configs == [("1 thread", 1, "internal"), ("2 threads", 2, "threaded")]
    pages = [(("latency", "1 thread"), "0.json"), (("latency", "2 threads"), "1.json"),
             (("load", "sentiment", bench.DEFAULT_ROUTE), "2.json")]
    load = {"error": None, "requests": [
        {"url": "http://h/wasm/litert/litert_wasm_internal.wasm", "bytes": 9_000_000},
        {"url": "http://h/wasm/litert/litert_wasm_internal.js", "bytes": 300_000},
        {"url": "http://h/models/0/5/model_int8_buckets.tflite", "bytes": 700_000},
        {"url": "http://h/bench.html", "bytes": 400}],
        "result": {"tasks": [{"routes": [{"loadMs": 800.0, "firstRunMs": 50.0,
                                          "modelBytes": 700_000}]}]}}
    results = [_page({ids[0]: [6.0, 6.0], ids[1]: [20.0, 20.0], ids[2]: [10.0, 10.0]}),
               _page({ids[0]: [12.0, 12.0], ids[1]: [20.0, 20.0], ids[2]: [10.0, 10.0]}),
               load]
    summary, latency_pages, problems = bench.summarize(tasks, configs, pages, results)
    routes = summary["sentiment"]["routes"]
    assert problems == []
    assert latency_pages["wasm_files"]["1 thread"] == ["litert_wasm_internal.wasm"]
    assert latency_pages["load_average"]["2 threads"] == (0.5, 0.75)
    assert routes[ids[0]]["latency"]["1 thread"]["p50_ratio"] == pytest.approx(0.6)
    assert routes[ids[0]]["latency"]["2 threads"]["p50_ratio"] == pytest.approx(1.2)
    assert routes[ids[0]]["agreement"] == 1.0
    assert routes[ids[0]]["cold_load"] == {"load_ms": 800.0, "first_run_ms": 50.0,
                                           "wasm_bytes": 9_300_000, "model_bytes": 700_000}
    assert bench.goal_lines(routes, configs) == [
        f"- 1 thread: `{ids[0]}` p50 6.00 ms, 0.60× onnxruntime-web dynamic int8 (goal ≤ 0.7×: "
        "met); the fastest route.",
        f"- 2 threads: `{ids[0]}` p50 12.00 ms, 1.20× onnxruntime-web dynamic int8 (goal ≤ 1×: "
        f"not met); the fastest is `{ids[2]}` at 10.00 ms."]
    report = {"cpu": "CPU", "cores": 2, "chromium": "156", "chromium_path": "/c",
              "packages": {"@litertjs/core": "2.5.3"}, "date": "2026-11-26", "seed": 0,
              "load_before": 0.5, "load_after": 0.7, "configs": configs, "tasks": tasks,
              "summary": summary, **latency_pages, "problems": ["x: failed"],
              "blocked": {"POST https://odml.pa.googleapis.com/v1/log": 2},
              "console_errors": []}
    text = bench.markdown(report)
    assert f"| `{ids[0]}` | buckets 16/24 (1/1) | 6.00 / 6.00 | 0.60 | 12.00 / 12.00 | 1.20 | " \
           "1.0000 | 800 (50.0) | 9.30 | 0.70 |" in text
    assert f"| `{ids[1]}` | exact length |" in text
    assert "2× `POST https://odml.pa.googleapis.com/v1/log`" in text
    assert "Failed: x: failed" in text
    assert "before / after each latency page: 1 thread 0.50 / 0.75; 2 threads" in text


def test_arguments_are_checked():
    with pytest.raises(SystemExit):
        bench.main(["nowhere", "--sentences", "0"])
    with pytest.raises(SystemExit):
        bench.main(["nowhere", "--chromium", "/no/such/chromium"])


def _tiny_export(root, values):
    """Trains `values` for one epoch and exports the run at the cheapest settings, with
    buckets from 8 tokens (at the runs' length 16 the default gives one bucket: no
    `_buckets` files). The export directory."""
    values["train"]["epochs"] = 1
    Trainer(TrainingConfig.from_dict(values)).run()
    export_run(root / "run", root / "export",
               ExportOptions(**QUICK_EXPORT, smallest_bucket=8, text_tflite=False))
    return root / "export"


@pytest.mark.slow
def test_every_route_runs_in_headless_chromium(tmp_path):
    """Both tasks, every file of the export, 1 and 2 threads, cold loads: positive, finite
    numbers for every route (about 2-3 minutes on two cores, most of it the two exports)."""
    missing = bench.check_tools("node", bench.CHROMIUM)
    if missing:
        pytest.skip("the browser benchmark needs " + "; ".join(missing))
    sentiment = _tiny_export(tmp_path / "sentiment",
                             config_dict(write_data(tmp_path / "sentiment/data"),
                                         tmp_path / "sentiment/run"))
    entities = _tiny_export(tmp_path / "entities", ner_config(tmp_path / "entities"))
    out = tmp_path / "web.md"
    report = bench.main([str(sentiment), str(entities), "--sentences", "4", "--chunk", "2",
                         "--warmup", "1", "--threads", "1", "2", "--no-compat",
                         "--load-repeats", "1", "--out", str(out),
                         "--sst2", str(tmp_path / "sentiment/data/dev.tsv"),
                         "--conll", str(tmp_path / "entities/dev.txt")])
    assert report["problems"] == [] and report["chromium"]
    assert report["environment"]["crossOriginIsolated"] is True
    assert set(report["summary"]) == {"sentiment", "entities"}
    for name, task in report["summary"].items():
        ids = set(task["routes"])
        assert {bench.DEFAULT_ROUTE, bench.BASELINE, bench.REFERENCE} <= ids, name
        default = task["routes"][bench.DEFAULT_ROUTE]["latency"]["1 thread"]
        assert default["signature_lengths"] == [8, 12, 16]
        if name == "entities":
            assert not any(i.startswith("mediapipe:") for i in ids)
        for route_id, route in task["routes"].items():
            for config in ("1 thread", "2 threads"):
                stats = route["latency"][config]
                assert stats["runs"] == 4, (name, route_id, config)
                for key in ("p50_ms", "p90_ms", "p50_ratio"):
                    assert math.isfinite(stats[key]) and stats[key] > 0, (route_id, key)
            load = route["cold_load"]
            assert all(math.isfinite(v) and v > 0 for v in load.values()), (route_id, load)
            assert 0.0 <= route["agreement"] <= 1.0
    assert out.read_text().count("| route | runs at |") == 2
    assert json.loads(out.with_suffix(".json").read_text())["summary"]
