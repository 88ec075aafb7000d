"""Choosing the `tf.distribute` strategy from the config and the environment."""

import json
import os
import socket
import urllib.parse

import tensorflow as tf

from keras_attn.errors import KerasAttnError


class StrategyError(KerasAttnError, RuntimeError):
    """The requested strategy cannot run here (no TPU reachable, a malformed TF_CONFIG...)."""


def tf_config_cluster():
    """`(cluster dict, task dict)` from the `TF_CONFIG` environment variable, or `(None, None)`.

    Raises `StrategyError` when `TF_CONFIG` is set but is not the JSON tf.distribute expects.
    """
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        return None, None
    try:
        tf_config = json.loads(raw)
        cluster, task = tf_config.get("cluster", {}), tf_config.get("task", {})
        workers = cluster.get("worker", [])
        if not isinstance(workers, list) or "type" not in task or "index" not in task:
            raise ValueError("needs cluster.worker (a list) and task.type / task.index")
    except (ValueError, AttributeError) as error:
        raise StrategyError(
            "TF_CONFIG must be JSON like {\"cluster\": {\"worker\": [\"host:port\", ...]}, "
            f"\"task\": {{\"type\": \"worker\", \"index\": 0}}}} ({error}). "
            f"Received: TF_CONFIG={raw[:200]!r}"
        ) from None
    return cluster, task


def split_cpu(num_devices):
    """Splits the host CPU into `num_devices` logical devices (before TF initializes them).

    Lets `MirroredStrategy` run several replicas on a CPU-only machine, as in tests.
    """
    cpus = tf.config.list_physical_devices("CPU")
    current = tf.config.get_logical_device_configuration(cpus[0])
    wanted = [tf.config.LogicalDeviceConfiguration()] * num_devices
    if current is not None and len(current) == num_devices:
        return
    try:
        tf.config.set_logical_device_configuration(cpus[0], wanted)
    except RuntimeError as error:
        raise StrategyError(
            f"cannot split the CPU into {num_devices} devices after TensorFlow has started "
            f"({error}); set distribute.logical_cpu_devices before anything else runs "
            "(a fresh process)."
        ) from None


def resolve_strategy(name="auto", tpu=None, logical_cpu_devices=None):
    """The `tf.distribute.Strategy` for `name` and a short description of it.

    - `"one_device"`: the default strategy (one GPU if present, else the CPU);
    - `"mirrored"`: `MirroredStrategy` over every local GPU (or the logical CPU devices);
    - `"multi_worker"`: `MultiWorkerMirroredStrategy` from `TF_CONFIG`;
    - `"tpu"`: `TPUStrategy` via `TPUClusterResolver(tpu)`;
    - `"auto"`: TPU when `tpu` is given, multi-worker when `TF_CONFIG` lists several
      workers, mirrored when there are several GPUs (or logical CPUs), else one device.

    Returns:
        `(strategy, description)`.
    """
    if logical_cpu_devices:
        split_cpu(logical_cpu_devices)
    if name == "auto":
        cluster, _ = tf_config_cluster()
        gpus = tf.config.list_physical_devices("GPU")
        if tpu:
            name = "tpu"
        elif cluster and len(cluster.get("worker", [])) + len(cluster.get("chief", [])) > 1:
            name = "multi_worker"
        elif len(gpus) > 1 or (logical_cpu_devices or 0) > 1:
            name = "mirrored"
        else:
            name = "one_device"

    if name == "one_device":
        strategy = tf.distribute.get_strategy()
        device = "GPU:0" if tf.config.list_physical_devices("GPU") else "CPU"
        return strategy, f"one device ({device})"
    if name == "mirrored":
        gpus = tf.config.list_logical_devices("GPU")
        devices = [d.name for d in gpus] or [d.name for d in tf.config.list_logical_devices("CPU")]
        strategy = tf.distribute.MirroredStrategy(devices)
        return strategy, f"MirroredStrategy over {len(devices)} local devices"
    if name == "multi_worker":
        cluster, task = tf_config_cluster()
        if cluster is None:
            raise StrategyError(
                "distribute.strategy=multi_worker needs TF_CONFIG describing the cluster, e.g. "
                "TF_CONFIG='{\"cluster\": {\"worker\": [\"host1:12345\", \"host2:12345\"]}, "
                "\"task\": {\"type\": \"worker\", \"index\": 0}}' on the first worker."
            )
        options = tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.AUTO
        )
        strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
        workers = len(cluster.get("worker", [])) + len(cluster.get("chief", []))
        return strategy, (
            f"MultiWorkerMirroredStrategy: {workers} workers, this is "
            f"{task['type']} {task['index']}, {strategy.num_replicas_in_sync} replicas in sync"
        )
    if name == "tpu":
        _probe_tpu_address(tpu)
        try:
            resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
            tf.config.experimental_connect_to_cluster(resolver)
            tf.tpu.experimental.initialize_tpu_system(resolver)
        except (ValueError, OSError, tf.errors.OpError, RuntimeError) as error:
            reason = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
            raise StrategyError(
                f"no TPU reachable (distribute.tpu={tpu!r}): {reason}. On a Cloud TPU VM use "
                "distribute.tpu=local; on a TPU node give its name or grpc://address."
            ) from None
        strategy = tf.distribute.TPUStrategy(resolver)
        return strategy, f"TPUStrategy, {strategy.num_replicas_in_sync} cores"
    raise StrategyError(f"unknown strategy {name!r}")


TPU_CONNECT_TIMEOUT_SECONDS = 10


def _probe_tpu_address(tpu):
    """Fails fast on a `grpc://host:port` nobody listens on (TensorFlow would wait forever)."""
    if not (isinstance(tpu, str) and tpu.startswith("grpc://")):
        return
    address = urllib.parse.urlsplit(tpu)
    try:
        port = address.port
    except ValueError:
        port = None
    if not address.hostname or port is None:
        raise StrategyError(
            f"distribute.tpu={tpu!r} is not a grpc://host:port address (e.g. "
            "grpc://10.0.0.2:8470)")
    try:
        socket.create_connection((address.hostname, port),
                                 timeout=TPU_CONNECT_TIMEOUT_SECONDS).close()
    except OSError as error:
        raise StrategyError(
            f"no TPU reachable (distribute.tpu={tpu!r}): cannot connect to "
            f"{address.hostname}:{port} within {TPU_CONNECT_TIMEOUT_SECONDS} s ({error}). Check "
            "the address and that the TPU is up; on a Cloud TPU VM use distribute.tpu=local."
        ) from None


def is_chief():
    """True on the worker that writes checkpoints, logs and results (worker 0 or `chief`)."""
    _, task = tf_config_cluster()
    if not task:
        return True
    return task["type"] == "chief" or (task["type"] == "worker" and int(task["index"]) == 0
                                       and not _has_chief())


def _has_chief():
    cluster, _ = tf_config_cluster()
    return bool(cluster and cluster.get("chief"))


def worker_index():
    """Index of this worker among the workers (0 without TF_CONFIG)."""
    _, task = tf_config_cluster()
    return int(task["index"]) if task else 0
