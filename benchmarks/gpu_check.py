"""One prepared check of keras-attn on a GPU, Keras 3 on JAX: tests, training against
keras-hub, generation. Made for a GPU machine lent for minutes, with Python 3.12, JAX (CUDA)
and numpy but no TensorFlow, no Keras and no network, in one run of at most ~8 minutes.

    make gpu-wheels                    # here: Keras, keras-hub and small deps -> gpu_wheels/
    bash benchmarks/gpu_check.sh       # there, with gpu_wheels/ beside the checkout: -> $OUT
    python benchmarks/gpu_check.py --quick --out /tmp/gpuq    # tiny sizes, JAX CPU, 1-2 min

Steps, each written to `gpu_check.json` and `gpu_check.md` in `--out` as soon as it is done
(a run cut short still leaves what it measured):

1. Installs the carried wheels (`--wheels`, default `gpu_wheels/`) that the machine lacks,
   with pip, offline, into a folder put on the path; keras_attn comes from this checkout.
   TensorFlow is blocked in every subprocess (`block_tensorflow`), here too, so a stray
   `import tensorflow` fails the same way everywhere.
2. The device: `jax.devices()`, versions, and the matmul peak in bfloat16 and float32
   (`jnp.matmul` of two N x N random matrices, default precision), the MFU reference.
3. The layer and model tests that need no TensorFlow (`GPU_TESTS`), with pytest, on the GPU.
4. Training with `model.fit` on synthetic batches (AdamW, sparse cross-entropy on logits,
   `jit_compile=True`): `BertClassifier` against keras-hub's `BertBackbone` + the same head
   (`benchmarks/peers.py` builds both), MiniLM-L6 and BERT-base, T=128 and 512; our
   `GPTCausalLM` against keras-hub's `GPT2Backbone` + its tied-embedding head at GPT-2
   small, T=1024; float32 and mixed_bfloat16. Every model is its own process (the dtype
   policy is global, the peak device memory per process): the processes of one round are
   built and compiled at once, then each trains one window of steps in turn, in an order
   rotated per round (interleaved windows). Reported: median step time and tokens/s (first
   step of each window untimed), MFU (analytic matmul FLOPs per step / step time / the
   measured peak of the step's precision), peak device memory (`peak_bytes_in_use`).
5. Generation with our KV cache (`GPTCausalLM.generate`, greedy, jitted whole): new tokens/s
   at batch 1 and 32, timed in the GPT round's windows.

A round is skipped (and reported so) when less than `--min-round-s` of `--budget-s` is left.
"""

import argparse
import dataclasses
import datetime
import json
import math
import os
import pathlib
import platform
import queue
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE)]
import peers  # noqa: E402  (benchmarks/peers.py: the BERT contenders, data and FLOPs)

# The tests that run on the GPU: layers and models on keras.ops only. A test module that
# imports TensorFlow at its top cannot be collected there (test_generation.py and
# test_gpt_causal_lm.py do, for their TensorFlow-only tests): it is left out.
GPU_TESTS = (
    "tests/test_alibi_bias.py", "tests/test_attention_mask.py",
    "tests/test_auxiliary_loss_lm.py", "tests/test_bert_backbone.py",
    "tests/test_bert_task_models.py", "tests/test_crf.py", "tests/test_gpt_backbone.py",
    "tests/test_masked_sparse_categorical_crossentropy.py", "tests/test_model_config.py",
    "tests/test_model_saving.py", "tests/test_multi_head_attention.py",
    "tests/test_permutation_lm_inputs.py", "tests/test_position_embedding.py",
    "tests/test_relative_multi_head_attention.py", "tests/test_rotary_embedding.py",
    "tests/test_scaled_dot_product_attention.py", "tests/test_scored_attention.py",
    "tests/test_seq2seq_transformer.py", "tests/test_shaw_relative_attention.py",
    "tests/test_sinusoidal_position_encoding.py", "tests/test_t5_relative_position_bias.py",
    "tests/test_token_and_position_embedding.py", "tests/test_transformer_decoder_block.py",
    "tests/test_transformer_encoder_block.py", "tests/test_transformer_xl_block.py",
    "tests/test_transformer_xl_lm.py", "tests/test_validation.py", "tests/test_xlnet_models.py",
)
QUICK_TESTS = ("tests/test_attention_mask.py",)
# Model sizes: BERT_PRESETS["minilm_l6_h384"] / ["bert_base"] and GPT_PRESETS["gpt2_small"]
# of keras_attn.models (tests/test_gpu_check.py checks they agree); `*_tiny` for --quick.
SIZES = {
    "minilm_l6": dict(num_layers=6, hidden_dim=384, num_heads=12, intermediate_dim=1536),
    "bert_base": dict(num_layers=12, hidden_dim=768, num_heads=12, intermediate_dim=3072),
    "gpt2_small": dict(num_layers=12, hidden_dim=768, num_heads=12, intermediate_dim=3072),
    "bert_tiny": dict(num_layers=1, hidden_dim=32, num_heads=2, intermediate_dim=64),
    "gpt_tiny": dict(num_layers=1, hidden_dim=32, num_heads=2, intermediate_dim=64),
}
PRECISIONS = ("float32", "mixed_bfloat16")
CONTENDERS = ("keras_attn", "keras_hub")
PACKAGES = ("jax", "jaxlib", "keras", "keras-hub", "numpy", "ml-dtypes", "optree", "pytest")
MESSAGE = "@@gpu_check "  # prefix of a worker's protocol lines on its stdout
QUICK_XLA_FLAGS = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"


@dataclasses.dataclass
class Settings:
    """What a run measures: the rounds of models and the step counts."""

    rounds: list
    warmup_steps: int
    windows: int
    window_steps: int
    peak_size: int
    generation: dict
    tests: tuple


def full_settings():
    """The GPU run: four rounds of processes built at once and timed interleaved."""
    bert = dict(family="bert", vocabulary_size=30522, max_sequence_length=512)
    gpt = dict(family="gpt", vocabulary_size=50257, max_sequence_length=1024)
    # A round's processes share the GPU's memory: BERT-base and GPT-2 at T=512/1024 keep
    # ~10-25 GB of activations each in float32 (no rematerialization), hence 4 per round.
    rounds = [
        [dict(bert, size="minilm_l6", sequence_length=128, batch_size=128),
         dict(bert, size="minilm_l6", sequence_length=512, batch_size=32)],
        [dict(bert, size="bert_base", sequence_length=128, batch_size=64)],
        [dict(gpt, size="gpt2_small", sequence_length=1024, batch_size=4)],
        [dict(bert, size="bert_base", sequence_length=512, batch_size=16)],
    ]
    generation = dict(size="gpt2_small", vocabulary_size=50257, max_sequence_length=1024,
                      precision="mixed_bfloat16", prompt_length=64, new_tokens=256,
                      batch_sizes=[1, 32])
    return Settings(rounds, warmup_steps=3, windows=5, window_steps=5, peak_size=8192,
                    generation=generation, tests=GPU_TESTS)


def quick_settings():
    """`--quick`: the same rounds' kinds at tiny sizes, JAX on CPU."""
    bert = dict(family="bert", vocabulary_size=2048, max_sequence_length=64, size="bert_tiny")
    gpt = dict(family="gpt", vocabulary_size=512, max_sequence_length=64, size="gpt_tiny")
    rounds = [[dict(bert, sequence_length=16, batch_size=4)],
              [dict(gpt, sequence_length=16, batch_size=4)]]
    generation = dict(size="gpt_tiny", vocabulary_size=512, max_sequence_length=64,
                      precision="mixed_bfloat16", prompt_length=4, new_tokens=8,
                      batch_sizes=[1, 32])
    return Settings(rounds, warmup_steps=2, windows=2, window_steps=2, peak_size=256,
                    generation=generation, tests=QUICK_TESTS)


def round_jobs(models, settings):
    """One worker job per (model, precision, contender) of a round, plus generation in
    the GPT round."""
    steps = dict(warmup_steps=settings.warmup_steps, window_steps=settings.window_steps)
    jobs = [dict(model, kind="train", precision=precision, contender=contender, **steps)
            for model in models for precision in PRECISIONS for contender in CONTENDERS]
    if any(model["family"] == "gpt" for model in models):
        jobs.append(dict(settings.generation, kind="generate", contender="keras_attn"))
    return jobs


# === FLOPs ===

def bert_config(job):
    """The `peers.BenchConfig` of a BERT job (tanh GELU, as keras-hub's BERT has)."""
    return peers.BenchConfig(
        **SIZES[job["size"]], sequence_length=job["sequence_length"],
        batch_size=job["batch_size"], vocabulary_size=job["vocabulary_size"],
        max_sequence_length=job["max_sequence_length"])


def gpt_training_flops_per_step(num_layers, hidden_dim, intermediate_dim, vocabulary_size,
                                sequence_length, batch_size, **unused):
    """Analytic matmul FLOPs of one causal-LM training step (backward = 2 x forward):

        fwd = 2 L (4 H^2 + 2 H F) B T      Q, K, V, O and the FFN, every token
            + 4 L B T^2 H                  Q K^T and A V over the full T x T (as PaLM's MFU)
            + 2 B T H V                    tied-embedding logits
        step = 3 fwd

    Example:
    >>> gpt_training_flops_per_step(1, 4, 8, 10, sequence_length=3, batch_size=2)
    6912
    """
    L, H, F, V = num_layers, hidden_dim, intermediate_dim, vocabulary_size
    B, T = batch_size, sequence_length
    forward = 2 * L * (4 * H * H + 2 * H * F) * B * T + 4 * L * B * T * T * H + 2 * B * T * H * V
    return 3 * forward


def training_flops_per_step(job):
    if job["family"] == "bert":
        return peers.training_flops_per_step(bert_config(job))
    return gpt_training_flops_per_step(**SIZES[job["size"]], **job)


# === Worker side: one model per process ===

def reply(kind, **data):
    """One protocol line to the driver (everything else on stdout is ignored)."""
    print(MESSAGE + json.dumps(dict(data, message=kind)), flush=True)


def memory_report():
    """Peak memory of this process: the device's `peak_bytes_in_use` where JAX keeps it
    (GPU), else the host's peak resident set (CPU)."""
    import jax

    stats = jax.local_devices()[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats:
        return {"peak_memory_mb": stats["peak_bytes_in_use"] / 2**20,
                "memory_kind": "device peak_bytes_in_use"}
    return {"peak_memory_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "memory_kind": "host peak RSS"}


def matmul_peak_tflops(size, dtype, repeats=10, rounds=3):
    """TFLOP/s of `jnp.matmul` of two `(size, size)` random matrices (`2 size^3` FLOPs a
    product), the best of `rounds` rounds of `repeats` back-to-back products."""
    import jax
    import jax.numpy as jnp

    a_key, b_key = jax.random.split(jax.random.key(0))
    a = jax.random.normal(a_key, (size, size), dtype)
    b = jax.random.normal(b_key, (size, size), dtype)
    product = jax.jit(jnp.matmul)
    product(a, b).block_until_ready()
    best = math.inf
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(repeats):
            c = product(a, b)
        c.block_until_ready()
        best = min(best, (time.perf_counter() - start) / repeats)
    return 2 * size**3 / best / 1e12


def device_worker(job):
    import jax

    device = jax.devices()[0]
    reply("ready", platform=device.platform, device_kind=device.device_kind,
          devices=[str(d) for d in jax.devices()], versions=versions(),
          python=platform.python_version(),
          default_matmul_precision=str(jax.config.jax_default_matmul_precision),
          peak_tflops={"mixed_bfloat16": matmul_peak_tflops(job["peak_size"], "bfloat16"),
                       "float32": matmul_peak_tflops(job["peak_size"], "float32")},
          tensorflow_imported="tensorflow" in sys.modules)
    serve(dict)


def serve(window):
    """The worker's loop: one `window()` per `window` command, its dict sent back; on any
    other command (`stop`) or end of input, the final `done` with the peak memory."""
    for command in sys.stdin:
        if command.strip() != "window":
            break
        reply("window", **window())
    reply("done", tensorflow_imported="tensorflow" in sys.modules, **memory_report())


def build_gpt(job):
    """Our `GPTCausalLM`, or keras-hub's `GPT2Backbone` with its tied-embedding head (the
    graph of keras-hub's `GPT2CausalLM`, without preprocessor)."""
    import keras

    sizes = dict(SIZES[job["size"]], vocabulary_size=job["vocabulary_size"],
                 max_sequence_length=job["max_sequence_length"])
    if job["contender"] == "keras_attn":
        from keras_attn.models import GPTBackbone
        from keras_attn.models import GPTCausalLM

        return GPTCausalLM(GPTBackbone(**sizes, dropout=job.get("dropout", 0.1)))
    import keras_hub

    backbone = keras_hub.models.GPT2Backbone(**sizes, dropout=0.1)
    logits = backbone.token_embedding(backbone(backbone.input), reverse=True)  # (B, T, V)
    return keras.Model(backbone.input, logits, name="keras_hub_gpt2_lm")


def training_batches(job, steps):
    """`steps` batches of synthetic `(inputs, labels)` as numpy arrays."""
    count = steps * job["batch_size"]
    if job["family"] == "bert":
        return peers.synthetic_examples(bert_config(job), count)
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, job["vocabulary_size"], (count, job["sequence_length"] + 1))
    inputs = {"token_ids": tokens[:, :-1].astype("int32"),
              "padding_mask": np.ones((count, job["sequence_length"]), "int32")}
    return inputs, tokens[:, 1:].astype("int32")  # (N, T) next tokens


def train_worker(job):
    """Builds and compiles one contender, warms it up, then trains one window of
    `window_steps + 1` steps per `window` command (the first step untimed)."""
    import keras

    keras.config.set_dtype_policy(job["precision"])
    keras.utils.set_random_seed(0)
    model = (peers.build_contender(job["contender"], bert_config(job))
             if job["family"] == "bert" else build_gpt(job))
    model.compile(optimizer=keras.optimizers.AdamW(learning_rate=1e-4, weight_decay=0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=True)
    x, y = training_batches(job, max(job["warmup_steps"], job["window_steps"] + 1))
    fit = dict(batch_size=job["batch_size"], epochs=1, shuffle=False, verbose=0)
    start = time.perf_counter()
    model.fit(x, y, steps_per_epoch=job["warmup_steps"], **fit)
    reply("ready", parameters=int(model.count_params()),
          warmup_s=time.perf_counter() - start)

    def window():
        timer = peers._step_timer()  # times each step's end, the loss read first
        model.fit(x, y, steps_per_epoch=job["window_steps"] + 1, callbacks=[timer], **fit)
        return {"step_seconds": np.diff(timer.times[1:]).tolist()}

    serve(window)


def jitted_generate(model, new_tokens):
    """`model.generate` as one jitted JAX function of (variable values, prompt ids): the
    weights are arguments, not constants folded into the program."""
    import jax
    import keras

    def generate(values, prompt_ids):
        with keras.StatelessScope(state_mapping=list(zip(model.variables, values))):
            return model.generate(prompt_ids, max_new_tokens=new_tokens)

    return jax.jit(generate)


def generate_worker(job):
    """Our GPT generating `new_tokens` greedily after a random prompt, per batch size:
    compiled at start, then timed once per `window` command."""
    import keras

    keras.config.set_dtype_policy(job["precision"])
    keras.utils.set_random_seed(0)
    model = build_gpt(dict(job, contender="keras_attn", dropout=0.0))
    values = [v.value for v in model.variables]
    generate = jitted_generate(model, job["new_tokens"])
    rng = np.random.default_rng(0)
    prompts = {b: rng.integers(1, job["vocabulary_size"], (b, job["prompt_length"]))
               .astype("int32") for b in job["batch_sizes"]}
    compile_s = {}
    for batch, prompt in prompts.items():
        start = time.perf_counter()
        generate(values, prompt).block_until_ready()
        compile_s[batch] = time.perf_counter() - start
    reply("ready", parameters=int(model.count_params()), compile_s=compile_s)

    def window():
        seconds = {}
        for batch, prompt in prompts.items():
            start = time.perf_counter()
            generate(values, prompt).block_until_ready()
            seconds[batch] = time.perf_counter() - start
        return {"seconds": seconds}

    serve(window)


WORKERS = {"device": device_worker, "train": train_worker, "generate": generate_worker}


def versions():
    import importlib.metadata

    found = {}
    for package in PACKAGES:
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = "not installed"
    import keras_attn

    found["keras-attn"] = keras_attn.__version__
    return found


# === Driver side ===

def block_tensorflow(folder):
    """A `tensorflow` (and `tensorflow_text`) package in `folder` whose import raises
    ModuleNotFoundError, as on the GPU machine: with `folder` first on PYTHONPATH, keras and
    keras-hub run as they do without TensorFlow, and a test or model that imports it fails
    here as it would there."""
    for name in ("tensorflow", "tensorflow_text", "tf_keras"):
        package = pathlib.Path(folder) / name
        package.mkdir(parents=True, exist_ok=True)
        (package / "__init__.py").write_text(
            f"raise ModuleNotFoundError('{name} is blocked by benchmarks/gpu_check.py "
            f"(the GPU machine has none)', name='{name}')\n")
    return str(folder)


def install_wheels(wheels, site):
    """Installs, offline into `site`, each wheel in `wheels` whose distribution is not
    installed already (the machine's own pytest, numpy or h5py are kept). Returns the
    names installed."""
    import importlib.metadata

    missing = []
    for wheel in sorted(pathlib.Path(wheels).glob("*.whl")):
        name = wheel.name.split("-")[0].replace("_", "-")
        try:
            importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(wheel)
    if missing:
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index",
                        "--no-deps", "--no-compile", "--no-cache-dir", "--upgrade",
                        "--target", str(site), *map(str, missing)], check=True)
    return [w.name.split("-")[0] for w in missing]


def worker_environment(args, work_dir, installed):
    """The environment of every subprocess: JAX backend, TensorFlow blocked, the wheels
    installed by this run (`installed`) and this checkout on the path, JAX allocating on
    demand (several processes share the GPU; peak_bytes_in_use is then what each used)."""
    paths = [block_tensorflow(os.path.join(work_dir, "blocked")), str(ROOT)]
    if installed:
        paths.insert(1, args.site)
    env = dict(os.environ, KERAS_BACKEND="jax", XLA_PYTHON_CLIENT_PREALLOCATE="false",
               TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(paths + [os.environ.get("PYTHONPATH", "")]))
    if args.quick:  # tiny models: XLA's CPU compile time is most of the run, so cut it
        env["JAX_PLATFORMS"] = "cpu"
        env["XLA_FLAGS"] = " ".join([env.get("XLA_FLAGS", ""), QUICK_XLA_FLAGS]).strip()
    return env


class WorkerError(RuntimeError):
    pass


class Worker:
    """A worker subprocess (`--worker JOB.json`) and its protocol lines, read by a thread so
    that every wait has a deadline; its stderr goes to `<job>.log`."""

    def __init__(self, job, env, work_dir, number):
        self.job = job
        stem = os.path.join(work_dir, f"job_{number:02d}_{job['kind']}")
        with open(stem + ".json", "w") as f:
            json.dump(job, f)
        self.log_path = stem + ".log"
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(
                [sys.executable, str(pathlib.Path(__file__).resolve()), "--worker",
                 stem + ".json"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=log, text=True, env=env, cwd=ROOT)
        self.messages = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.process.stdout:
            if line.startswith(MESSAGE):
                self.messages.put(json.loads(line[len(MESSAGE):]))
        self.messages.put(None)  # end of output: the process exited

    def receive(self, expected, deadline):
        try:
            message = self.messages.get(timeout=max(1.0, deadline - time.monotonic()))
        except queue.Empty:
            self.kill()
            raise WorkerError(f"no '{expected}' before the time budget ran out") from None
        if message is None or message["message"] != expected:
            self.kill()
            raise WorkerError(f"exited before '{expected}':\n{self.log_tail()}")
        return message

    def send(self, command):
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()

    def log_tail(self, lines=12):
        with open(self.log_path, errors="replace") as f:
            return "\n".join(f.read().strip().splitlines()[-lines:])

    def kill(self):
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


def run_round(jobs, env, work_dir, settings, deadline, first_number):
    """Starts every job's worker at once (building and compiling in parallel), then
    `settings.windows` rounds of one window per worker, in an order rotated per round.
    Returns one result dict per job: its messages, or its error."""
    workers = [Worker(job, env, work_dir, first_number + i) for i, job in enumerate(jobs)]
    results = [dict(job) for job in jobs]
    live = []
    for worker, result in zip(workers, results):
        try:
            result["ready"] = worker.receive("ready", deadline)
            live.append((worker, result))
        except WorkerError as error:
            result["error"] = str(error)
    for w in range(settings.windows if live else 0):
        for worker, result in live[w % len(live):] + live[:w % len(live)]:
            if "error" in result:
                continue
            try:
                worker.send("window")
                result.setdefault("windows", []).append(worker.receive("window", deadline))
            except (WorkerError, OSError) as error:
                result["error"] = str(error)
    for worker, result in live:
        if "error" not in result:
            try:
                worker.send("stop")
                result["done"] = worker.receive("done", deadline)
            except (WorkerError, OSError) as error:
                result["error"] = str(error)
        worker.kill()
    return results


def summarize_training(result, peaks):
    """The row of a training job: median step time, tokens/s, MFU, peak memory."""
    job = {k: v for k, v in result.items() if k not in ("ready", "windows", "done")}
    if "error" in result:
        return job
    steps = [s for window in result["windows"] for s in window["step_seconds"]]
    tokens = result["batch_size"] * result["sequence_length"]
    step = statistics.median(steps)
    flops = training_flops_per_step(result)
    return dict(
        job, parameters=result["ready"]["parameters"], warmup_s=result["ready"]["warmup_s"],
        step_ms=1e3 * step, step_ms_p10_p90=[1e3 * q for q in np.percentile(steps, [10, 90])],
        tokens_per_s=tokens / step,
        window_tokens_per_s=[tokens * len(w["step_seconds"]) / sum(w["step_seconds"])
                             for w in result["windows"]],
        flops_per_step=flops, mfu=flops / step / (peaks[result["precision"]] * 1e12),
        peak_memory_mb=result["done"]["peak_memory_mb"],
        memory_kind=result["done"]["memory_kind"],
        tensorflow_imported=result["done"]["tensorflow_imported"])


def summarize_generation(result):
    """One row per batch size: new tokens/s over the median of the timed windows."""
    job = {k: v for k, v in result.items() if k not in ("ready", "windows", "done")}
    if "error" in result:
        return [dict(job, batch_size=b) for b in result["batch_sizes"]]
    rows = []
    for batch in result["batch_sizes"]:
        seconds = statistics.median(w["seconds"][str(batch)] for w in result["windows"])
        rows.append(dict(
            {k: v for k, v in job.items() if k != "batch_sizes"}, batch_size=batch,
            seconds=seconds, tokens_per_s=batch * result["new_tokens"] / seconds,
            ms_per_token=1e3 * seconds / result["new_tokens"],
            compile_s=result["ready"]["compile_s"][str(batch)],
            parameters=result["ready"]["parameters"],
            peak_memory_mb=result["done"]["peak_memory_mb"],
            memory_kind=result["done"]["memory_kind"],
            tensorflow_imported=result["done"]["tensorflow_imported"]))
    return rows


def run_tests(files, env, work_dir, timeout_s, workers):
    """pytest on `files` in a subprocess on the JAX backend, float32 matmuls at full
    precision (JAX's GPU default rounds them to TF32; the tests compare with float32
    references). Counts from pytest's summary line, or from its progress line when the
    time budget cut it short."""
    if not _has_module("pytest"):
        return {"error": "pytest is not installed"}
    command = [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", *files]
    if workers > 1 and _has_module("xdist"):
        command[3:3] = ["-n", str(workers)]
    env = dict(env, JAX_DEFAULT_MATMUL_PRECISION="highest")
    start = time.perf_counter()
    try:
        process = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT,
                                 timeout=max(1.0, timeout_s))
        output, code = process.stdout + process.stderr, process.returncode
    except subprocess.TimeoutExpired as expired:
        output, code = _text(expired.stdout) + _text(expired.stderr), "timeout"
    with open(os.path.join(work_dir, "tests.log"), "w") as f:
        f.write(output)
    lines = output.strip().splitlines() or [""]
    counts = {kind.rstrip("s") if kind == "errors" else kind: int(n) for n, kind in re.findall(
        r"(\d+) (passed|failed|skipped|errors?|xfailed)", lines[-1])}
    if code == "timeout":  # the progress characters printed so far
        progress = "".join(line.split(" [")[0] for line in lines
                           if re.fullmatch(r"[.sFExX]+( +\[ *\d+%\])?", line.strip()))
        counts = {kind: progress.count(char) for char, kind in
                  ((".", "passed"), ("s", "skipped"), ("F", "failed"), ("E", "error"))}
        lines[-1] = f"cut at {timeout_s:.0f} s: " + ", ".join(
            f"{n} {kind}" for kind, n in counts.items())
    return dict(counts, exit_code=code, seconds=time.perf_counter() - start,
                files=len(files), summary=lines[-1],
                failures=[line for line in lines if line.startswith(("FAILED", "ERROR"))][:30])


def _has_module(name):
    import importlib.util

    return importlib.util.find_spec(name) is not None


def _text(data):
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


def gpu_name():
    """nvidia-smi's name, memory and driver of the first GPU, or None without one."""
    try:
        process = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
             "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return process.stdout.strip().splitlines()[0] if process.returncode == 0 else None


def write_outputs(results, out):
    with open(os.path.join(out, "gpu_check.json"), "w") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(out, "gpu_check.md"), "w") as f:
        f.write(render_markdown(results))


# === Report ===

def _cell(value, digits=0):
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    return f"{value:,.{digits}f}"


def _status(row):
    if "skipped" in row:
        return f"skipped ({row['skipped']})"
    return "failed: " + row["error"].strip().splitlines()[-1][:120].replace("|", "/")


def training_table(rows):
    lines = ["| model | T | batch | precision | contender | params (M) | step (ms) | tokens/s "
             "| vs keras-hub | MFU | peak memory (GiB) |", "|" + " --- |" * 11]
    speed = {(r["family"], r["size"], r["sequence_length"], r["precision"], r["contender"]):
             r.get("tokens_per_s") for r in rows}
    for r in rows:
        head = (f"| {r['size']} | {r['sequence_length']} | {r['batch_size']} | "
                f"{r['precision']} | {r['contender']} |")
        if "tokens_per_s" not in r:
            lines.append(f"{head} {_status(r)} |" + " |" * 5)
            continue
        peer = speed.get((r["family"], r["size"], r["sequence_length"], r["precision"],
                          "keras_hub"))
        ratio = r["tokens_per_s"] / peer if peer else None
        lines.append(
            f"{head} {_cell(r['parameters'] / 1e6, 1)} | {_cell(r['step_ms'], 1)} | "
            f"{_cell(r['tokens_per_s'])} | {_cell(ratio, 2)}× | {_cell(100 * r['mfu'], 1)} % | "
            f"{_cell(r['peak_memory_mb'] / 1024, 2)} |")
    return lines


def generation_table(rows):
    lines = ["| model | precision | batch | prompt + new | new tokens/s | ms per step "
             "| compile (s) | peak memory (GiB) |", "|" + " --- |" * 8]
    for r in rows:
        head = (f"| {r['size']} | {r['precision']} | {r['batch_size']} | "
                f"{r['prompt_length']} + {r['new_tokens']} |")
        if "tokens_per_s" not in r:
            lines.append(f"{head} {_status(r)} |" + " |" * 3)
            continue
        lines.append(f"{head} {_cell(r['tokens_per_s'])} | {_cell(r['ms_per_token'], 2)} | "
                     f"{_cell(r['compile_s'], 1)} | {_cell(r['peak_memory_mb'] / 1024, 2)} |")
    return lines


def render_markdown(results):
    device = results.get("device", {})
    v = device.get("versions", {})
    peaks = device.get("peak_tflops", {})
    tests = results.get("tests", {})
    lines = [
        f"GPU check of {results['date']} (`{results['command']}`, {results['seconds']:.0f} s):",
        "",
        f"- device: {results.get('gpu') or device.get('device_kind', '?')} "
        f"(JAX: {', '.join(device.get('devices', ['?']))})",
        f"- versions: JAX {v.get('jax')} (jaxlib {v.get('jaxlib')}), Keras {v.get('keras')}, "
        f"keras-hub {v.get('keras-hub')}, keras-attn {v.get('keras-attn')}, numpy "
        f"{v.get('numpy')}, Python {device.get('python')}",
        f"- matmul peak, `jnp.matmul` {results['settings']['peak_size']}² (default "
        f"precision): bfloat16 {_cell(peaks.get('mixed_bfloat16'), 1)} TFLOP/s, float32 "
        f"{_cell(peaks.get('float32'), 1)} TFLOP/s",
        f"- tests ({tests.get('files', 0)} files, TensorFlow blocked): "
        f"{tests.get('summary') or tests.get('error') or 'not run'}",
        "", "Training, `model.fit` with `jit_compile=True`, median over "
        f"{results['settings']['windows']} interleaved windows of "
        f"{results['settings']['window_steps']} steps:", "",
        *training_table(results.get("train", [])), "",
        "Generation, our `GPTCausalLM.generate` (greedy, KV cache, one jitted program):", "",
        *generation_table(results.get("generation", [])),
    ]
    return "\n".join(lines) + "\n"


# === Command line ===

def run_check(args):
    """Every step in order; the results are written after each."""
    start, deadline = time.monotonic(), time.monotonic() + args.budget_s
    settings = quick_settings() if args.quick else full_settings()
    os.makedirs(args.out, exist_ok=True)
    work_dir = tempfile.mkdtemp(prefix="keras_attn_gpu_check_")
    installed = install_wheels(args.wheels, args.site) if os.path.isdir(args.wheels) else []
    env = worker_environment(args, work_dir, installed)
    results = dict(
        command="python benchmarks/gpu_check.py " + " ".join(args.argv),
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        gpu=gpu_name(), installed_wheels=installed, seconds=0.0,
        settings=dataclasses.asdict(settings), train=[], generation=[])

    def save(step):
        results["seconds"] = time.monotonic() - start
        write_outputs(results, args.out)
        print(f"[gpu_check] {step} done at {results['seconds']:.0f} s", flush=True)

    device = run_round([dict(kind="device", peak_size=settings.peak_size)], env, work_dir,
                       dataclasses.replace(settings, windows=0), deadline, 0)[0]
    results["device"] = device.get("ready", {"error": device.get("error")})
    save(f"device: {results['gpu'] or results['device'].get('device_kind')}")
    if not args.skip_tests:
        budget = min(args.tests_budget_s, deadline - time.monotonic())
        results["tests"] = run_tests(settings.tests, env, work_dir, budget, args.test_workers)
        copy_log(os.path.join(work_dir, "tests.log"), args.out)
        save(f"tests: {results['tests'].get('summary') or results['tests'].get('error')}")
    peaks = results["device"].get("peak_tflops", {})
    for i, models in enumerate(settings.rounds):
        jobs = round_jobs(models, settings)
        if deadline - time.monotonic() < args.min_round_s:
            done = [dict(job, skipped="time budget") for job in jobs]
        else:
            done = run_round(jobs, env, work_dir, settings, deadline, 10 * (i + 1))
        for result in done:
            if result["kind"] == "train":
                results["train"].append(summarize_training(result, peaks))
            else:
                results["generation"] += summarize_generation(result)
        save(f"round {i + 1} ({', '.join(sorted({m['size'] for m in models}))})")
    return results


def copy_log(path, out):
    if os.path.exists(path):
        with open(path, errors="replace") as f, open(os.path.join(out, "tests.log"), "w") as g:
            g.write(f.read())


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes, JAX on CPU, the same steps (1-2 min on 2 cores)")
    parser.add_argument("--out", default=os.environ.get("OUT") or "gpu_check_out",
                        help="folder of gpu_check.json, gpu_check.md, tests.log "
                        "(default: $OUT, else ./gpu_check_out)")
    parser.add_argument("--wheels", default=str(ROOT / "gpu_wheels"),
                        help="carried wheels, installed where missing (`make gpu-wheels`)")
    parser.add_argument("--site", default=os.path.join(tempfile.gettempdir(),
                                                       "keras_attn_gpu_site"),
                        help="where the wheels are installed (put on the path)")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="wall-clock budget of the whole run (default 510; --quick 900)")
    parser.add_argument("--min-round-s", type=float, default=None,
                        help="a round starts only with this much budget left (default 75; "
                        "--quick 0)")
    parser.add_argument("--tests-budget-s", type=float, default=230,
                        help="pytest is stopped after this many seconds")
    parser.add_argument("--test-workers", type=int, default=None,
                        help="pytest-xdist workers (default 16; --quick 1)")
    parser.add_argument("--skip-tests", action="store_true")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.argv = list(argv)
    for name, full, quick in (("budget_s", 510, 900), ("min_round_s", 75, 0),
                              ("test_workers", 16, 1)):
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    return args


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.worker:
        with open(args.worker) as f:
            job = json.load(f)
        WORKERS[job["kind"]](job)
        return
    results = run_check(args)
    print(render_markdown(results))
    print(f"[gpu_check] wrote {args.out}/gpu_check.json and gpu_check.md")


if __name__ == "__main__":
    main()
