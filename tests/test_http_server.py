"""`keras-attn serve`: TF Serving's REST API over a SavedModel, on 127.0.0.1.

The predictions are compared with calling the SavedModel's signatures directly; each class of
bad request gets its status and message, and the server keeps answering afterwards."""

import base64
import concurrent.futures
import dataclasses
import http.client
import json
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import threading
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_attn.export.serving_module import export_saved_model
from keras_attn.models.bert_backbone import BertBackbone
from keras_attn.models.bert_classifier import BertClassifier
from keras_attn.models.bert_token_classifier import BertTokenClassifier
from keras_attn.stages.inference.http_server import ServerLimits
from keras_attn.stages.inference.http_server import make_server
from keras_attn.stages.inference.http_server import serve_in_thread
from keras_attn.stages.inference.rest_api import RestApi
from keras_attn.stages.inference.rest_api import find_saved_model
from keras_attn.stages.inference.rest_values import COUNTED_OUTPUTS
from keras_attn.text.label_vocabulary import LabelVocabulary
from keras_attn.text.tokenizer import WordPieceTokenizer

pytestmark = pytest.mark.tensorflow

REPO = pathlib.Path(__file__).resolve().parents[1]
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "good", "bad", "film", "plot", "the",
         "was", "very", "paris", "anna", "new", "york", "in", "##s"]
NER_LABELS = LabelVocabulary(["O", "B-LOC", "B-PER", "I-LOC", "I-PER"])
TEXTS = ["the film was good", "Bad plot!", "anna was in new york", "", "Über 北京 naïve"]
MAX_BATCH, MAX_TEXT_CHARS, MAX_REQUEST_BYTES = 4, 40, 4000


def _model(cls, **kwargs):
    keras.utils.set_random_seed(11)
    backbone = BertBackbone(vocabulary_size=len(VOCAB), num_layers=1, num_heads=2,
                            hidden_dim=8, intermediate_dim=16, max_sequence_length=8)
    model = cls(backbone, **kwargs)
    dense = model.get_layer("logits")  # spread the random model's predictions over classes
    rng = np.random.default_rng(2)
    dense.kernel.assign(rng.normal(scale=3.0, size=tuple(dense.kernel.shape)))
    return model


@pytest.fixture(scope="module")
def saved_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve")
    tokenizer = WordPieceTokenizer(VOCAB, sequence_length=8)
    classifier = export_saved_model(
        _model(BertClassifier, num_classes=3), tokenizer,
        LabelVocabulary(["negative", "neutral", "positive"]), root / "sst" / "saved_model")
    # The TF Serving layout: NAME/<version>/saved_model.pb.
    tagger = export_saved_model(_model(BertTokenClassifier, num_labels=len(NER_LABELS)),
                                tokenizer, NER_LABELS, root / "ner" / "3")
    return pathlib.Path(classifier), pathlib.Path(tagger)


@pytest.fixture(scope="module")
def server(saved_models):
    api = RestApi(saved_models[0], model_name="sst", max_batch=MAX_BATCH,
                  max_text_chars=MAX_TEXT_CHARS)
    lines = []
    httpd = make_server(api, "127.0.0.1", 0, max_request_bytes=MAX_REQUEST_BYTES,
                        log=lines.append)
    serve_in_thread(httpd)
    yield httpd, api, lines
    httpd.shutdown()
    httpd.server_close()


def request(server, method, path, body=None, headers=None):
    """`(status, parsed JSON, response headers)`; `body` is JSON-encoded unless bytes."""
    httpd = server[0] if isinstance(server, tuple) else server
    connection = http.client.HTTPConnection(*httpd.server_address[:2], timeout=60)
    if body is not None and not isinstance(body, bytes):
        body = json.dumps(body).encode("utf-8")
    connection.request(method, path, body=body, headers=headers or {})
    response = connection.getresponse()
    payload = json.loads(response.read().decode("utf-8"))
    connection.close()
    return response.status, payload, dict(response.getheaders())


def direct(saved_model_dir, texts, signature="serving_default"):
    from keras_attn.export.serving_module import load_saved_model

    function = load_saved_model(saved_model_dir).signatures[signature]
    return {k: v.numpy() for k, v in function(text=tf.constant(texts)).items()}


def _text(values):
    return np.vectorize(lambda v: v.decode("utf-8"), otypes=[object])(values).tolist()


# --- good requests -------------------------------------------------------------------------------


def test_model_status_is_tf_serving_s(server):
    for path in ("/v1/models/sst", "/v1/models/sst/versions/1"):
        status, body, headers = request(server, "GET", path)
        assert status == 200
        assert headers["Content-Type"] == "application/json"
        assert body == {"model_version_status": [{
            "version": "1", "state": "AVAILABLE",
            "status": {"error_code": "OK", "error_message": ""}}]}


def test_metadata_describes_every_signature(server, saved_models):
    status, body, _ = request(server, "GET", "/v1/models/sst/metadata")
    assert status == 200
    assert body["model_spec"] == {"name": "sst", "signature_name": "", "version": "1"}
    signatures = body["metadata"]["signature_def"]["signature_def"]
    assert sorted(signatures) == ["metadata", "predict_ids", "serving_default"]
    serving = signatures["serving_default"]
    assert serving["method_name"] == "tensorflow/serving/predict"
    assert serving["inputs"]["text"]["dtype"] == "DT_STRING"
    assert serving["inputs"]["text"]["tensor_shape"] == {
        "dim": [{"size": "-1", "name": ""}], "unknown_rank": False}
    expected = direct(saved_models[0], ["good"])
    assert sorted(serving["outputs"]) == sorted(expected)
    probabilities = serving["outputs"]["probabilities"]
    assert probabilities["dtype"] == "DT_FLOAT"
    assert [d["size"] for d in probabilities["tensor_shape"]["dim"]] == ["-1", "3"]
    assert signatures["predict_ids"]["inputs"]["token_ids"]["dtype"] == "DT_INT32"
    assert signatures["metadata"]["inputs"] == {}


def test_row_predictions_equal_the_saved_model(server, saved_models):
    expected = direct(saved_models[0], TEXTS[:MAX_BATCH])
    status, body, _ = request(server, "POST", "/v1/models/sst:predict",
                              {"instances": TEXTS[:MAX_BATCH]})
    assert status == 200
    predictions = body["predictions"]
    assert len(predictions) == MAX_BATCH
    np.testing.assert_allclose([p["probabilities"] for p in predictions],
                               expected["probabilities"], atol=1e-6)
    assert [p["label"] for p in predictions] == _text(expected["label"])
    assert [p["label_id"] for p in predictions] == expected["label_id"].tolist()
    # Each text gets its own answer (the rows differ), in request order.
    assert np.ptp(np.array([p["probabilities"] for p in predictions]), axis=0).max() > 2e-5
    # The same with instances as objects, on the explicit version, and binary-encoded text.
    encoded = [{"text": {"b64": base64.b64encode(t.encode()).decode()}}
               for t in TEXTS[:MAX_BATCH]]
    for path, instances in (("/v1/models/sst/versions/1:predict",
                             [{"text": t} for t in TEXTS[:MAX_BATCH]]),
                            ("/v1/models/sst:predict", encoded)):
        status, again, _ = request(server, "POST", path, {"instances": instances})
        assert status == 200 and again == body


def test_columnar_predictions_equal_the_saved_model(server, saved_models):
    expected = direct(saved_models[0], TEXTS[1:3])
    for inputs in (TEXTS[1:3], {"text": TEXTS[1:3]}):
        status, body, _ = request(server, "POST", "/v1/models/sst:predict", {"inputs": inputs})
        assert status == 200
        outputs = body["outputs"]
        assert sorted(outputs) == sorted(expected)
        np.testing.assert_allclose(outputs["probabilities"], expected["probabilities"],
                                   atol=1e-6)
        assert outputs["label"] == _text(expected["label"])


def test_other_signatures(server, saved_models):
    from keras_attn.export.serving_module import load_saved_model

    signatures = load_saved_model(saved_models[0]).signatures
    ids = {"token_ids": [[2, 5, 7, 3], [2, 6, 3, 0]], "segment_ids": [[0] * 4] * 2,
           "padding_mask": [[1, 1, 1, 1], [1, 1, 1, 0]]}
    expected = signatures["predict_ids"](**{k: tf.constant(v) for k, v in ids.items()})
    status, body, _ = request(server, "POST", "/v1/models/sst:predict", {
        "signature_name": "predict_ids",
        "instances": [{k: v[row] for k, v in ids.items()} for row in range(2)]})
    assert status == 200
    # One output: TF Serving drops its name.
    np.testing.assert_allclose(body["predictions"], expected["logits"].numpy(), atol=1e-6)
    status, body, _ = request(server, "POST", "/v1/models/sst:predict",
                              {"signature_name": "metadata", "inputs": {}})
    assert status == 200
    assert body["outputs"]["labels"] == ["negative", "neutral", "positive"]
    assert body["outputs"]["task"] == "classification"


def _cut(name, values, row_counts):
    """The signature's padded row `values` of output `name` cut to the row's own count."""
    for count, names in COUNTED_OUTPUTS.items():
        if name in names:
            return values[:row_counts[count]]
    return values


def test_tagger_rows_list_their_own_words_and_entities(saved_models):
    directory, version = find_saved_model(saved_models[1].parent)
    assert (directory, version) == (saved_models[1], "3")
    api = RestApi(saved_models[1].parent, model_name="ner")
    texts = ["anna was in new york", "paris"]
    status, body = api.handle("POST", "/v1/models/ner/versions/3:predict",
                              json.dumps({"instances": texts}).encode())
    assert status == 200
    expected = direct(saved_models[1], texts)
    for row, prediction in enumerate(body["predictions"]):
        assert sorted(prediction) == sorted(expected)
        counts = {c: int(expected[c][row]) for c in COUNTED_OUTPUTS}
        for name, value in expected.items():
            value = value[row]
            want = _text(value) if value.dtype == object else value.tolist()
            assert prediction[name] == _cut(name, want, counts), name
    # The signature pads the short text's rows to the longer one's; row format cuts them (the
    # answer's size follows each text, not the longest text of the request).
    assert len(expected["words"][1]) == 5
    assert body["predictions"][1]["words"] == ["paris"]
    assert body["predictions"][1]["num_words"] == 1
    # Columnar answers keep the signature's padding to the longest row of the request.
    status, body = api.handle("POST", "/v1/models/ner:predict",
                              json.dumps({"inputs": texts}).encode())
    assert status == 200
    assert body["outputs"]["words"] == _text(expected["words"])


def test_concurrent_requests_get_their_own_answers(server, saved_models):
    texts = [TEXTS[i % len(TEXTS)] for i in range(16)]
    expected = direct(saved_models[0], texts)["probabilities"]

    def one(text):
        return request(server, "POST", "/v1/models/sst:predict", {"instances": [text]})

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(one, texts))
    assert [status for status, _, _ in answers] == [200] * 16
    got = [body["predictions"][0]["probabilities"] for _, body, _ in answers]
    np.testing.assert_allclose(got, expected, atol=1e-6)


# --- bad requests --------------------------------------------------------------------------------


@pytest.mark.parametrize("body, status, message", [
    (b"{not json", 400, r"Invalid JSON at line 1 column 2"),
    (b"", 400, r"Empty request body"),
    (b"\xff\xfe", 400, r"not UTF-8"),
    ([1, 2], 400, r"must be a JSON object .* received a list"),
    ({"instances": []}, 400, r"`instances` is empty"),
    ({"instances": "good"}, 400, r"`instances` must be a list .* received a string"),
    ({"instances": [3]}, 400, r'Input "text" value 0 must be a string .* received a number'),
    ({"instances": ["fine", None]}, 400, r'value 1 must be a string .* received a null'),
    ({"instances": [["a", "b"]]}, 400, r'must have rank 1 \(shape \[-1\]\); the request gives '
                                       r'shape \[1, 2\]'),
    ({"instances": [{"txt": "good"}]}, 400, r"missing \['text'\], unknown \['txt'\]"),
    ({"instances": ["x" * (MAX_TEXT_CHARS + 1)]}, 400,
     rf"has {MAX_TEXT_CHARS + 1} characters; this server takes at most {MAX_TEXT_CHARS}"),
    ({"instances": ["good"] * (MAX_BATCH + 1)}, 400,
     rf"has {MAX_BATCH + 1} examples; this server takes at most {MAX_BATCH}"),
    ({"inputs": {"text": []}}, 400, r'inputs\["text"\] is empty'),
    ({"instances": ["a"], "inputs": ["a"]}, 400, r"either `instances` .* not both"),
    ({"signature_name": "nope", "instances": ["a"]}, 400,
     r'Serving signature name: "nope" not found'),
    ({"instance": ["a"]}, 400, r"Unknown key\(s\) \['instance'\]"),
    ({"signature_name": "predict_ids", "instances": [
        {"token_ids": [2, 3], "segment_ids": [0, 0], "padding_mask": [1, 1]},
        {"token_ids": [2, 3], "segment_ids": [0], "padding_mask": [1, 1]}]}, 400,
     r'Input "segment_ids" is ragged: its lists have different lengths at depth 1'),
    ({"signature_name": "predict_ids", "instances": [
        {"token_ids": [2, 3.5], "segment_ids": [0, 0], "padding_mask": [1, 1]}]}, 400,
     r'"token_ids" value 1 must be an integer \(DT_INT32\)'),
    ({"instances": [{"b64": "***"}]}, 400, r"`b64` is not valid base64"),
])
def test_bad_predict_requests_get_400_and_the_server_stays_up(server, body, status, message):
    got, answer, _ = request(server, "POST", "/v1/models/sst:predict", body)
    assert got == status
    assert re.search(message, answer["error"]), answer
    assert request(server, "GET", "/v1/models/sst")[0] == 200


def test_wrong_routes_methods_and_sizes(server):
    cases = [
        ("GET", "/v1/models/other", None, 404, r"Servable not found for request: Latest\(other\)"),
        ("GET", "/v1/models/sst/versions/2", None, 404,
         r"Servable not found for request: Specific\(sst, 2\)"),
        ("GET", "/v2/anything", None, 404, r"Malformed request: GET /v2/anything"),
        ("POST", "/v1/models/sst:classify", {"examples": []}, 404, r"implements :predict only"),
        ("GET", "/v1/models/sst:predict", None, 405, r"GET is not allowed .* use POST"),
        ("POST", "/v1/models/sst", {"instances": ["a"]}, 405, r"POST is not allowed .* use GET"),
        ("PUT", "/v1/models/sst", b"{}", 405, r"PUT is not allowed"),
        ("POST", "/v1/models/sst:predict", b"x" * (MAX_REQUEST_BYTES + 1), 413,
         rf"has {MAX_REQUEST_BYTES + 1} bytes; this server takes at most {MAX_REQUEST_BYTES}"),
    ]
    for method, path, body, status, message in cases:
        got, answer, headers = request(server, method, path, body)
        assert got == status, (method, path, answer)
        assert re.search(message, answer["error"]), answer
        if status == 405:
            assert headers["Allow"] == "GET, POST"
    # No Content-Length: 411 (http.client always sends one, so write the request by hand).
    connection = http.client.HTTPConnection(*server[0].server_address[:2], timeout=60)
    connection.putrequest("POST", "/v1/models/sst:predict")
    connection.endheaders()
    response = connection.getresponse()
    assert response.status == 411
    assert "Content-Length" in json.loads(response.read())["error"]
    connection.close()
    assert request(server, "GET", "/v1/models/sst")[0] == 200


def test_failing_model_and_handler_give_500_and_the_server_stays_up(server, monkeypatch):
    httpd, api, lines = server

    def broken(**inputs):
        raise RuntimeError("out of memory (simulated)")

    monkeypatch.setitem(api.signatures, "serving_default", broken)
    status, body, _ = request(server, "POST", "/v1/models/sst:predict", {"instances": ["a"]})
    assert status == 500
    assert body["error"] == "The model failed: RuntimeError: out of memory (simulated)"
    monkeypatch.undo()

    def crash(method, path, body):
        raise KeyError("bug")

    monkeypatch.setattr(api, "handle", crash)
    status, body, _ = request(server, "GET", "/v1/models/sst")
    assert (status, body) == (500, {"error": "Internal error: KeyError: 'bug'"})
    monkeypatch.undo()
    assert request(server, "POST", "/v1/models/sst:predict", {"instances": ["good"]})[0] == 200
    # Every answered request is logged with its status and latency.
    assert any(re.search(r'"POST /v1/models/sst:predict" 500 \d+ bytes [\d.]+ ms', line)
               for line in lines)


def test_arguments_are_checked(saved_models, tmp_path):
    with pytest.raises(ValueError, match="holds no SavedModel"):
        RestApi(tmp_path)
    with pytest.raises(ValueError, match="`max_batch` must be a positive integer"):
        RestApi(saved_models[0], max_batch=0)
    with pytest.raises(ValueError, match="`model_name` must be letters"):
        RestApi(saved_models[0], model_name="a/b")
    damaged = tmp_path / "damaged"
    shutil.copytree(saved_models[0], damaged)
    pb = damaged / "saved_model.pb"
    pb.write_bytes(pb.read_bytes()[:200])  # cut short
    with pytest.raises(ValueError, match=r"damaged: TensorFlow cannot load this SavedModel "
                                         r"\(.*\); it is damaged or incomplete: re-run "):
        RestApi(damaged)
    with pytest.raises(ValueError, match="`max_request_bytes` must be a positive integer"):
        make_server(None, port=0, max_request_bytes=0)


def test_cli_serves_until_stopped(saved_models):
    """`keras-attn serve` in a subprocess on a free port: it prints its URL and answers."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    process = subprocess.Popen(
        [sys.executable, "-m", "keras_attn.cli", "serve", str(saved_models[0].parent),
         "--model-name", "sst2", "--port", "0", "--max-batch", "2"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        first = process.stdout.readline()
        match = re.search(r"http://127\.0\.0\.1:(\d+)/v1/models/sst2", first)
        assert match, first
        connection = http.client.HTTPConnection("127.0.0.1", int(match.group(1)), timeout=60)
        connection.request("POST", "/v1/models/sst2:predict",
                           json.dumps({"instances": ["good", "bad", "film"]}))
        response = connection.getresponse()
        assert response.status == 400  # --max-batch 2 reached the server
        assert "at most 2 per request" in json.loads(response.read())["error"]
        connection.request("POST", "/v1/models/sst2:predict", json.dumps({"instances": ["good"]}))
        response = connection.getresponse()
        assert response.status == 200
        expected = direct(saved_models[0], ["good"])["probabilities"][0]
        np.testing.assert_allclose(json.loads(response.read())["predictions"][0]
                                   ["probabilities"], expected, atol=1e-6)
        connection.close()
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_cli_serve_reports_a_missing_saved_model(tmp_path, capsys):
    from keras_attn.cli import main

    assert main(["serve", str(tmp_path)]) == 2
    assert "keras-attn serve: error:" in capsys.readouterr().err


# --- bounded resources, hostile input, batching -------------------------------------------------

TIGHT = ServerLimits(max_connections=20, header_timeout=0.6, request_timeout=4.0,
                     keep_alive_timeout=2.0, workers=1, max_batch_size=8, batch_timeout=0.05,
                     max_queued_examples=64, max_header_bytes=2048)


@pytest.fixture(scope="module")
def tight_server(saved_models):
    api = RestApi(saved_models[0], model_name="sst", max_batch=MAX_BATCH,
                  max_text_chars=MAX_TEXT_CHARS)
    for size in (1, 8):  # the first calls of a loaded SavedModel are slow: not in a deadline
        api.handle("POST", "/v1/models/sst:predict",
                   json.dumps({"instances": ["good"] * size}).encode())
    lines = []
    httpd = make_server(api, "127.0.0.1", 0, max_request_bytes=MAX_REQUEST_BYTES,
                        log=lines.append, limits=TIGHT)
    serve_in_thread(httpd)
    yield httpd, api, lines
    httpd.shutdown()
    httpd.server_close()


def raw(server, data, timeout=10):
    """Sends raw bytes, returns `(status, body bytes)` of the answer or `(None, b"")` when
    the server closed the connection without one."""
    with socket.create_connection(server[0].server_address, timeout=timeout) as sock:
        sock.sendall(data)
        received = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
            head, _, body = received.partition(b"\r\n\r\n")
            length = re.search(rb"(?i)content-length: *(\d+)", head)
            if length and len(body) >= int(length.group(1)):
                break
    if not received:
        return None, b""
    head, _, body = received.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def good_answer(server):
    """A predict request answered correctly: the server is still fine."""
    status, body, _ = request(server, "POST", "/v1/models/sst:predict", {"instances": ["good"]})
    assert status == 200, body
    return body["predictions"][0]["probabilities"]


IDS = {"token_ids": [2, 5, 7, 3], "segment_ids": [0, 0, 0, 0], "padding_mask": [1, 1, 1, 1]}


@pytest.mark.parametrize("body, message", [
    (b"[" * 1000 + b"]" * 1000, r"nests lists/objects 1000 levels deep; .* at most 32"),
    (b"{\"instances\": [" + b"1" * 3000 + b"]}", r"integer of 3000 digits; .* at most 20"),
    ({"signature_name": "predict_ids", "instances": [{**IDS, "token_ids": [2, -5, 7, 3]}]},
     r'"token_ids" value -5 at \[0, 1\] is out of range: allowed \[0, 18\)'),
    ({"signature_name": "predict_ids", "instances": [IDS, {**IDS, "token_ids": [2, 5, 7, 18]}]},
     r'"token_ids" value 18 at \[1, 3\] is out of range: allowed \[0, 18\)'),
    ({"signature_name": "predict_ids", "instances": [{**IDS, "padding_mask": [1, 1, 2, 0]}]},
     r'"padding_mask" value 2 at \[0, 2\] is out of range: allowed \[0, 2\)'),
    ({"signature_name": "predict_ids", "instances": [{k: v * 3 for k, v in IDS.items()}]},
     r'has 12 tokens per example; this model takes at most 8'),
])
def test_hostile_bodies_get_400_before_model_work(server, body, message):
    got, answer, _ = request(server, "POST", "/v1/models/sst:predict", body)
    assert got == 400
    assert re.search(message, answer["error"]), answer
    good_answer(server)


@pytest.mark.parametrize("headers, message", [
    (b"Content-Length: 2_0\r\n", "Content-Length '2_0' is not a number"),
    (b"Content-Length: 20\r\nContent-Length: 21\r\n", "2 Content-Length headers"),
    (b"Content-Length: 20\r\ncontent-length: 20\r\n", "2 Content-Length headers"),
    (b"Content-Length: 20, 20\r\n", "Content-Length '20, 20'"),
    (b"Content-Length: -1\r\n", "Content-Length '-1' is not a number"),
    (b"Content-Length: 20\r\nX: a\x00b\r\n", "Malformed HTTP request"),
    (b"Content-Length: 20\r\nTransfer-Encoding: chunked\r\n", "Transfer-Encoding"),
])
def test_content_length_is_strict(server, headers, message):
    """One Content-Length of digits: identical duplicates and lists (which h11 merges into
    one value) are rejected too, with a JSON error."""
    body = json.dumps({"instances": ["good"]}).encode()[:20]
    status, answer = raw(server, b"POST /v1/models/sst:predict HTTP/1.1\r\nHost: x\r\n" +
                         headers + b"\r\n" + body)
    assert status == 400
    assert message in json.loads(answer)["error"]
    good_answer(server)


def test_headers_past_max_header_bytes_get_a_json_400(tight_server):
    status, answer = raw(tight_server, b"GET /v1/models/sst HTTP/1.1\r\nHost: x\r\nX-Big: " +
                         b"a" * 3000 + b"\r\n\r\n")
    assert status == 400
    assert "more than 2048 bytes (--max-header-bytes)" in json.loads(answer)["error"]
    good_answer(tight_server)


def test_content_length_of_pipelined_requests_is_checked(server):
    """The second request of one write, after a body, is checked as strictly as the first."""
    body = json.dumps({"instances": ["good"]}).encode()
    first = (b"POST /v1/models/sst:predict HTTP/1.1\r\nHost: x\r\nContent-Length: " +
             str(len(body)).encode() + b"\r\n\r\n" + body)
    second = (b"GET /v1/models/sst HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n"
              b"Content-Length: 0\r\n\r\n")
    with socket.create_connection(server[0].server_address, timeout=10) as sock:
        sock.sendall(first + second)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    assert received.startswith(b"HTTP/1.1 200"), received[:200]
    assert b"HTTP/1.1 400" in received and b"2 Content-Length headers" in received, received


def test_keep_alive_answers_are_not_held_by_delayed_acks(server):
    """Answers leave at once (TCP_NODELAY): on a keep-alive connection each answer's body
    used to wait ~40 ms for the client's delayed ACK of its headers."""
    connection = http.client.HTTPConnection(*server[0].server_address[:2], timeout=60)
    connection.connect()
    connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    times = []
    for _ in range(12):
        started = time.perf_counter()
        connection.request("GET", "/v1/models/sst")
        connection.getresponse().read()
        times.append(time.perf_counter() - started)
    connection.close()
    assert np.median(times[2:]) < 0.02, times


def test_slow_clients_are_cut_off_at_their_deadlines(tight_server):
    """A client trickling header bytes is disconnected at --header-timeout, one trickling its
    body gets 408 at --request-timeout (the old server reset its timeout on every byte)."""
    started = time.monotonic()
    with socket.create_connection(tight_server[0].server_address, timeout=10) as sock:
        closed = False
        for byte in b"GET /v1/models/sst HTTP/1.1\r\nX-Slow: " + b"a" * 40:  # <= 8 s
            try:
                sock.sendall(bytes([byte]))
                time.sleep(0.2)
            except OSError:
                closed = True
                break
            if sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"" if _readable(sock) \
                    else False:
                closed = True
                break
        assert closed
    assert time.monotonic() - started < TIGHT.header_timeout + 1.0
    started = time.monotonic()
    status, body = raw(tight_server, b"POST /v1/models/sst:predict HTTP/1.1\r\nHost: x\r\n"
                       b"Content-Length: 100\r\n\r\n{\"instances\"")
    assert status == 408, body
    assert b"did not arrive within 4 s" in body
    assert time.monotonic() - started < TIGHT.request_timeout + 1.0
    good_answer(tight_server)


def _readable(sock):
    import select

    return bool(select.select([sock], [], [], 0)[0])


def test_connections_are_bounded(tight_server):
    held = [socket.create_connection(tight_server[0].server_address, timeout=10)
            for _ in range(TIGHT.max_connections)]
    try:
        time.sleep(0.2)  # accepted by the server
        status, body = raw(tight_server, b"GET /v1/models/sst HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status == 503, body
        assert "--max-connections" in json.loads(body)["error"]  # TF Serving's error body
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.2)
    good_answer(tight_server)


def test_ner_answers_grow_with_each_text_not_with_the_longest(saved_models):
    """One long text among short ones: each short row lists only its own words, so the answer
    stays within a small multiple of the request (the signature pads every row)."""
    api = RestApi(saved_models[1].parent, model_name="ner", max_text_chars=20_000)
    texts = ["paris " * 2000] + ["anna"] * 63
    request_body = json.dumps({"instances": texts}).encode()
    status, body = api.handle("POST", "/v1/models/ner:predict", request_body)
    assert status == 200
    assert [len(p["words"]) for p in body["predictions"]] == [2000] + [1] * 63
    answer = json.dumps(body).encode()
    assert len(answer) <= 16 * len(request_body) + 2048 * len(texts), len(answer)


def test_columnar_ner_answers_are_bounded_by_the_request(saved_models):
    """Columnar answers are tensors padded to the longest row: one long text among short ones
    would multiply the request (10 MB for 20 KB); past 16 x the request + 2 KB per text the
    answer is a 400 pointing to the row format, which has no such padding."""
    api = RestApi(saved_models[1].parent, model_name="ner", max_text_chars=20_000)
    texts = ["paris " * 2000] + ["anna"] * 63
    request_body = json.dumps({"inputs": texts}).encode()
    status, body = api.handle("POST", "/v1/models/ner:predict", request_body)
    assert status == 400
    assert re.search(r"padded to the longest text \(2000 words\).* at most 16 x the "
                     r"request's \d+ bytes \+ 2048 per text.*row format", body["error"]), body
    small = json.dumps({"inputs": TEXTS}).encode()
    status, body = api.handle("POST", "/v1/models/ner:predict", small)
    assert status == 200
    rows = api.handle("POST", "/v1/models/ner:predict", json.dumps({"instances": TEXTS}).encode())
    assert body["outputs"]["num_words"] == [row["num_words"] for row in rows[1]["predictions"]]
    assert len(json.dumps(body).encode()) <= 16 * len(small) + 2048 * len(TEXTS)


def test_batched_answers_equal_unbatched_ones(saved_models, tight_server):
    """16 concurrent one-text requests are merged into fewer model calls (--max-batch-size 8);
    every answer equals the SavedModel on that text alone."""
    texts = [f"{TEXTS[i % 3]} {VOCAB[5 + i % 10]}" for i in range(16)]
    serve = tight_server[1].signatures["serving_default"]
    alone = [serve(text=tf.constant([t]))["probabilities"][0].numpy() for t in texts]
    batcher = tight_server[0].app.batcher
    before = batcher.batches_run

    def one(text):
        return request(tight_server, "POST", "/v1/models/sst:predict", {"instances": [text]})

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(one, texts))
    assert [status for status, _, _ in answers] == [200] * 16
    got = [body["predictions"][0]["probabilities"] for _, body, _ in answers]
    np.testing.assert_allclose(got, alone, atol=1e-6)
    assert batcher.batches_run - before < 16


def test_fuzzed_requests_never_get_5xx(tight_server):
    """150 mutated requests (bounded: stops after 30 s) on 127.0.0.1: no 5xx, and a correct
    answer after every one."""
    rng = np.random.default_rng(26)
    expected = good_answer(tight_server)
    seeds = [json.dumps(b).encode() for b in (
        {"instances": ["good film"]}, {"inputs": {"text": ["bad", "plot"]}},
        {"signature_name": "predict_ids", "instances": [IDS]},
        {"instances": [{"b64": "Z29vZA=="}]})]
    stop = time.monotonic() + 30
    for index in range(150):
        if time.monotonic() > stop:
            break
        body = bytearray(seeds[index % len(seeds)])
        for _ in range(int(rng.integers(1, 6))):
            position = int(rng.integers(0, len(body)))
            choice = rng.integers(0, 3)
            if choice == 0:
                body[position] = int(rng.integers(0, 256))
            elif choice == 1:
                body[position:position] = bytes(rng.choice(list(b'[]{}",:-0123456789e.\\'), 3))
            else:
                del body[position]
        status, answer, _ = request(tight_server, "POST", "/v1/models/sst:predict", bytes(body))
        assert status < 500, (bytes(body), answer)
        np.testing.assert_allclose(good_answer(tight_server), expected, atol=1e-6)


def test_client_gone_is_one_log_line_and_no_traceback(tight_server, caplog):
    lines = tight_server[2]
    before = len(lines)
    with socket.create_connection(tight_server[0].server_address, timeout=10) as sock:
        sock.sendall(b"POST /v1/models/sst:predict HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Length: 200\r\n\r\n{\"instances\"")
    deadline = time.monotonic() + 10
    while len(lines) == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(lines) == before + 1 and " 499 " in lines[-1], lines[before:]
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]
    good_answer(tight_server)


def test_serve_help_documents_every_limit_with_its_default():
    from keras_attn.cli import build_parser

    serve = build_parser()._subparsers._group_actions[0].choices["serve"]
    text = serve.format_help()
    for field in dataclasses.fields(ServerLimits):
        flag = "--" + field.name.replace("_", "-").replace("batch-timeout", "batch-timeout-ms")
        assert flag in text, flag
    for flag in ("--max-batch ", "--max-text-chars", "--max-request-bytes"):
        assert flag in text
    assert text.count("(default:") >= len(dataclasses.fields(ServerLimits)) + 2


def test_server_limits_are_checked_through_validation():
    with pytest.raises(ValueError, match="`workers` must be a number > 0. Received: workers=0"):
        ServerLimits(workers=0)
    with pytest.raises(ValueError, match=r"`max_batch_size` must be a number >= 0\. "
                                         r"Received: max_batch_size=True"):
        ServerLimits(max_batch_size=True)
    assert ServerLimits(max_batch_size=0, batch_timeout=0).max_batch_size == 0


# --- slow clients: connections are cheap, work is bounded -----------------------------------------

ROOMY = dataclasses.replace(TIGHT, max_connections=320, header_timeout=30.0,
                            keep_alive_timeout=30.0, request_timeout=10.0)


def test_idle_and_half_sent_connections_do_not_starve_requests(tight_server):
    """200 connections that sent half a request and 100 idle keep-alive ones are held open
    (they starved the old server: it counted them against 256 connections in progress);
    requests of another client still get their own, correct answers, and no thread is
    started for the held connections. Past the socket cap a new connection gets 503."""
    api = tight_server[1]  # already warm
    texts = [f"{TEXTS[i % 3]} {VOCAB[5 + i % 10]}" for i in range(12)]
    serve = api.signatures["serving_default"]
    alone = [serve(text=tf.constant([t]))["probabilities"][0].numpy() for t in texts]
    httpd = make_server(api, "127.0.0.1", 0, limits=ROOMY)
    serve_in_thread(httpd)
    held, idle = [], []
    try:
        good_answer((httpd, api))
        threads = threading.active_count()
        for _ in range(200):
            sock = socket.create_connection(httpd.server_address, timeout=10)
            sock.sendall(b"POST /v1/models/sst:predict HTTP/1.1\r\nHost: x\r\nContent-Le")
            held.append(sock)
        for _ in range(100):
            connection = http.client.HTTPConnection(*httpd.server_address, timeout=10)
            connection.request("GET", "/v1/models/sst")
            assert connection.getresponse().read().startswith(b'{"model_version_status"')
            idle.append(connection)
        _wait_for(lambda: len(httpd.server.server_state.connections) == 300)
        for text, expected in zip(texts, alone):
            status, body, _ = request(httpd, "POST", "/v1/models/sst:predict",
                                      {"instances": [text]})
            assert status == 200, body
            np.testing.assert_allclose(body["predictions"][0]["probabilities"], expected,
                                       atol=1e-6)
        assert threading.active_count() == threads
        assert not _readable_any(held)  # the half-sent requests wait for their deadline
        idle[0].request("GET", "/v1/models/sst")  # the idle connections are still usable
        assert idle[0].getresponse().status == 200
        held.extend(socket.create_connection(httpd.server_address, timeout=10)
                    for _ in range(ROOMY.max_connections - 300))
        status, body = raw((httpd,), b"GET /v1/models/sst HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status == 503 and b"holds 320 open connections" in body, body
    finally:
        for sock in held:
            sock.close()
        for connection in idle:
            connection.close()
        httpd.shutdown()
        httpd.server_close()


def test_trickling_clients_are_closed_at_the_header_deadline(tight_server):
    """Connections that never finish their headers are closed at --header-timeout, so an
    attacker must keep reopening them; they never got an answer."""
    socks = [socket.create_connection(tight_server[0].server_address, timeout=10)
             for _ in range(10)]
    for sock in socks:
        sock.sendall(b"GET /v1/models/sst HTTP/1.1\r\nX-Slow: a")
    time.sleep(TIGHT.header_timeout + 0.5)
    assert [sock.recv(100) for sock in socks] == [b""] * 10  # closed, nothing answered
    for sock in socks:
        sock.close()
    good_answer(tight_server)


def test_the_open_file_limit_is_raised_to_fit_the_connection_cap(monkeypatch):
    import resource

    from keras_attn.stages.inference import http_server

    calls = []
    monkeypatch.setattr(resource, "getrlimit", lambda kind: (1024, 4096))
    monkeypatch.setattr(resource, "setrlimit", lambda kind, limits: calls.append(limits))
    lines = []
    assert http_server._connection_cap(2000, lines.append) == 2000
    assert calls == [(2000 + http_server.FD_RESERVE, 4096)] and not lines
    assert http_server._connection_cap(8192, lines.append) == 4096 - http_server.FD_RESERVE
    assert calls[-1] == (4096, 4096)
    assert "--max-connections 8192 lowered to 3840" in lines[0] and "ulimit -Hn" in lines[0]


def _wait_for(condition, seconds=10):
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert condition()


def _readable_any(socks):
    import select

    return bool(select.select(socks, [], [], 0.2)[0])
