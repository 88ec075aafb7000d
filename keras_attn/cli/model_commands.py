"""The commands that use a trained run or its export: `keras-attn explain`, `predict` and
`serve` (each an `add_*_command(commands)` and its handler)."""

import json
import sys

from keras_attn.cli.flags import add_setting_flags
from keras_attn.cli.flags import positive_int
from keras_attn.cli.flags import settings_from_arguments
from keras_attn.cli.generation_commands import add_generation_arguments
from keras_attn.cli.generation_commands import generation_command
from keras_attn.cli.generation_commands import is_generation_artifact
from keras_attn.cli.terminal import say
from keras_attn.cli.translation_commands import is_translation_artifact
from keras_attn.cli.translation_commands import translation_command
from keras_attn.runs.task_registry import DEPLOYABLE_TASKS
from keras_attn.stages.explain import explain
from keras_attn.stages.inference.http_server import ServerLimits
from keras_attn.stages.inference.http_server import make_server
from keras_attn.stages.inference.http_server import url_of
from keras_attn.stages.inference.predictor import load_predictor
from keras_attn.stages.inference.rest_api import DEFAULT_MAX_BATCH
from keras_attn.stages.inference.rest_api import DEFAULT_MAX_TEXT_CHARS
from keras_attn.stages.inference.rest_api import RestApi
from keras_attn.text.batching import PREDICT_BATCH_SIZE
from keras_attn.text.text_lines import decode_lines
from keras_attn.text.text_lines import read_lines
from keras_attn.translation import is_translation_run


def add_explain_command(commands):
    """`keras-attn explain`."""
    explain = commands.add_parser(
        "explain",
        help="draw the attention maps (every layer and head) of a trained BERT run for one "
             f"sentence, with the prediction of a {' or '.join(DEPLOYABLE_TASKS)} run, as a "
             "PNG",
        description="Explain RUN_DIR (a keras-attn train output directory, or an export "
                    "directory whose source run still exists) on TEXT.",
    )
    explain.add_argument("run_dir", help="the training run directory (holds model.keras)")
    explain.add_argument("text", help="the sentence to explain (cut to the run's length)")
    explain.add_argument("--output", default="explain.png", help="the PNG to write")
    explain.add_argument("--layers", help="comma-separated layer indices, e.g. 0,5 (default "
                         "all)")
    explain.add_argument("--heads", help="comma-separated head indices (default all)")
    explain.add_argument("--position-encoding", metavar="PATH.png",
                         help="also write the sinusoidal position-encoding matrix there "
                              "(and the model's learned table to PATH_learned.png)")
    explain.set_defaults(handler=_explain)


def _explain(args):
    if is_translation_run(args.run_dir):  # a seq2seq run: its cross-attention alignment
        return translation_command("explain", args, say)
    summary = explain(args.run_dir, args.text, args.output, layers=args.layers,
                      heads=args.heads, position_encoding_png=args.position_encoding,
                      log=lambda note: say(f"note: {note}"))
    prediction = summary["prediction"]
    say(f"keras-attn explain {args.run_dir}: {summary['task']}"
        f"{'' if prediction else ' (attention only)'}, {len(summary['tokens'])} tokens")
    if prediction is not None:
        say(f"  {_explained_prediction(prediction)}")
    say(f"  attention of layers {summary['layers']} x heads {summary['heads']} "
        f"({summary['panels']} heatmaps): {summary['path']}")
    for name, path in summary["position_encoding_files"].items():
        say(f"  {name}: {path}")
    return 0


def _explained_prediction(prediction):
    """`explain`'s prediction in one line: a tagger's entities, or a classifier's label."""
    if "entities" in prediction:
        found = ", ".join(f"{e['text']} [{e['type']}]" for e in prediction["entities"])
        return f"entities: {found or 'none'}"
    probabilities = ", ".join(f"{label} {p:.3f}"
                              for label, p in prediction["probabilities"].items())
    return f"prediction: {prediction['label']} ({probabilities})"


def add_predict_command(commands):
    """`keras-attn predict`."""
    predict = commands.add_parser(
        "predict",
        help="run any artifact (run directory, model.keras, export directory, SavedModel, "
             ".tflite, .onnx) on texts and print labels or entities",
        description="Predict with ARTIFACT on the TEXTs, the lines of --file, or the lines "
                    "of stdin (one text per line; empty lines are skipped with a note).",
    )
    predict.add_argument("artifact", help="a run or export directory, saved_model/, "
                         "model.keras, model_*.tflite, translation_*.tflite or *.onnx")
    predict.add_argument("texts", nargs="*", metavar="TEXT", help="texts to predict")
    predict.add_argument("--file", help="a UTF-8 file with one text per line")
    predict.add_argument("--json", action="store_true",
                         help="one JSON object per text (line, text, label and probabilities "
                              "or entities and words)")
    predict.add_argument("--batch-size", type=positive_int, default=PREDICT_BATCH_SIZE,
                         help="texts per model call")
    predict.add_argument("--threads", type=positive_int,
                         help="LiteRT / onnxruntime threads (default: theirs)")
    translation = predict.add_argument_group(
        "translation (a seq2seq run, its export directory or a translation_*.tflite file)")
    translation.add_argument("--input", help="a file of source sentences, one per line")
    translation.add_argument("--output", help="write the translations here, one per line")
    translation.add_argument("--beams", type=positive_int,
                             help="beam width (default: the run's train.eval_num_beams)")
    add_generation_arguments(predict)
    predict.set_defaults(handler=_predict)


def _predict_inputs(args):
    """`(line number or None, text)` of the texts to predict: the arguments, `--file`, or stdin
    (one text per line; empty lines are skipped with a note)."""
    if args.texts and args.file:
        raise ValueError("give texts as arguments or --file PATH, not both")
    for index, text in enumerate(args.texts, start=1):
        if not text.strip():
            raise ValueError(f"TEXT argument {index} is empty: give a non-empty text")
    if args.texts:
        return [(None, text) for text in args.texts]
    if args.file:
        source, lines = args.file, read_lines(args.file)
    else:
        if sys.stdin is None or sys.stdin.closed:
            raise ValueError("no texts: stdin is closed; give texts as arguments or --file PATH")
        if sys.stdin.isatty():
            sys.stderr.write("keras-attn predict: reading texts from stdin, one per line "
                             "(Ctrl-D ends)\n")
        source = "<stdin>"
        # Bytes, decoded like --file: a BOM dropped, invalid UTF-8 named by its line.
        lines = decode_lines(source, getattr(sys.stdin, "buffer", sys.stdin))
    inputs = []
    for number, line in lines:
        if line.strip():
            inputs.append((number, line))
        else:
            sys.stderr.write(f"keras-attn predict: note: {source}:{number}: empty line "
                             "skipped\n")
    if not inputs:
        raise ValueError(f"{source} holds no text: one text per line")
    return inputs


def _predict(args):
    if is_translation_artifact(args.artifact):  # beam-search translations
        return translation_command("predict", args, say)
    if is_generation_artifact(args.artifact):  # a language model: continuations
        return generation_command("predict", args, say)
    inputs = _predict_inputs(args)
    predictor = load_predictor(args.artifact, num_threads=args.threads)
    results = predictor.predict([text for _, text in inputs], batch_size=args.batch_size)
    for (line, text), result in zip(inputs, results):
        if args.json:
            record = {"line": line} if line is not None else {}
            say(json.dumps({**record, "text": text, **result}, ensure_ascii=False))
        elif "label" in result:  # a classification; a tagger's result has entities
            label = result["label"]
            say(f"{label} (p={result['probabilities'][label]:.2f})\t{text}")
        else:
            say(text)
            for entity in result["entities"]:
                say(f"  {entity['type']:<6} {entity['start']:>4}-{entity['end']:<4} "
                    f"{entity['text']}")
            if not result["entities"]:
                say("  (no entities)")
    return 0


def add_serve_command(commands):
    """`keras-attn serve`."""
    serve = commands.add_parser(
        "serve",
        help="serve an exported SavedModel over HTTP with TensorFlow Serving's REST API",
        description="Serve SAVED_MODEL_DIR (saved_model/ of keras-attn export, the export "
                    "directory, or a TF Serving base path NAME/<version>/) at "
                    "/v1/models/NAME (status), /v1/models/NAME/metadata and "
                    "/v1/models/NAME:predict.",
    )
    serve.add_argument("saved_model_dir", help="the SavedModel (or export) directory")
    serve.add_argument("--model-name", default="model", help="NAME in the URLs")
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (0.0.0.0: every interface)")
    serve.add_argument("--port", type=int, default=8501, help="port (0: any free port)")
    _serve_limits(serve)
    serve.set_defaults(handler=_serve)


def _serve_limits(serve):
    """`keras-attn serve`'s limits: the request limits of `RestApi` and every `ServerLimits`
    setting, each with its default in --help."""
    limits = serve.add_argument_group(
        "limits", "every request is bounded in size and time, and the server in connections, "
        "threads and queued work")
    limits.add_argument("--max-batch", type=positive_int, default=DEFAULT_MAX_BATCH,
                        help="most examples per request; more: 400 (default: %(default)s)")
    limits.add_argument("--max-text-chars", type=positive_int, default=DEFAULT_MAX_TEXT_CHARS,
                        help="longest text of a request, in characters; longer: 400 "
                             "(default: %(default)s)")
    add_setting_flags(limits, ServerLimits)


def _serve(args):
    limits = ServerLimits(**settings_from_arguments(ServerLimits, args))
    api = RestApi(args.saved_model_dir, model_name=args.model_name,
                  max_batch=args.max_batch, max_text_chars=args.max_text_chars)
    server = make_server(api, args.host, args.port, limits.max_request_bytes,
                         log=lambda line: sys.stderr.write(line + "\n"), limits=limits)
    url = url_of(server, api)
    say(f"keras-attn serve {api.saved_model_dir} (version {api.version}): {url}")
    say(f"  curl -d '{{\"instances\": [\"some text\"]}}' {url}:predict   (Ctrl-C stops)")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        say("stopped")
    finally:
        server.server_close()
    return 0
