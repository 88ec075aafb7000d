"""Strategy selection: TF_CONFIG parsing, chief election, clear errors for unusable setups.

The strategies themselves are exercised end to end in `tests/test_trainer.py` (Mirrored over
2 logical CPUs, two MultiWorkerMirrored processes); here: what is decided before that.
"""

import json
import socket

import pytest
import tensorflow as tf

from keras_attn.training.strategy import StrategyError
from keras_attn.training.strategy import is_chief
from keras_attn.training.strategy import resolve_strategy
from keras_attn.training.strategy import tf_config_cluster
from keras_attn.training.strategy import worker_index

pytestmark = pytest.mark.tensorflow


def set_tf_config(monkeypatch, cluster, task):
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": task}))


def test_without_tf_config_this_process_is_the_only_worker(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert tf_config_cluster() == (None, None)
    assert is_chief() and worker_index() == 0


@pytest.mark.parametrize(
    "cluster, task, chief, index",
    [
        ({"worker": ["a:1", "b:2"]}, {"type": "worker", "index": 0}, True, 0),
        ({"worker": ["a:1", "b:2"]}, {"type": "worker", "index": 1}, False, 1),
        # With an explicit chief, worker 0 is not the one writing files.
        ({"chief": ["c:0"], "worker": ["a:1"]}, {"type": "worker", "index": 0}, False, 0),
        ({"chief": ["c:0"], "worker": ["a:1"]}, {"type": "chief", "index": 0}, True, 0),
    ],
)
def test_chief_election_follows_tf_config(monkeypatch, cluster, task, chief, index):
    set_tf_config(monkeypatch, cluster, task)
    assert tf_config_cluster() == (cluster, task)
    assert is_chief() == chief
    assert worker_index() == index


@pytest.mark.parametrize("raw", ["{not json", json.dumps({"cluster": {"worker": "a:1"},
                                                         "task": {"type": "worker"}})])
def test_malformed_tf_config_is_reported_with_its_value(monkeypatch, raw):
    monkeypatch.setenv("TF_CONFIG", raw)
    with pytest.raises(StrategyError, match=r"TF_CONFIG must be JSON like .*Received: TF_CONFIG="):
        tf_config_cluster()


def test_auto_and_one_device_pick_the_default_strategy(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    for name in ("auto", "one_device"):
        strategy, description = resolve_strategy(name)
        assert strategy is tf.distribute.get_strategy()
        assert description == "one device (CPU)"


def test_multi_worker_without_tf_config_explains_what_to_set(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(StrategyError, match="multi_worker needs TF_CONFIG"):
        resolve_strategy("multi_worker")


def test_unknown_strategy_is_an_error():
    with pytest.raises(StrategyError, match="unknown strategy 'gpu'"):
        resolve_strategy("gpu")


def test_tpu_without_a_name_or_reachable_tpu_fails_with_advice():
    for tpu in (None, "local"):
        with pytest.raises(StrategyError, match=r"no TPU reachable .*distribute.tpu=local"):
            resolve_strategy("tpu", tpu=tpu)


def test_unreachable_grpc_tpu_fails_fast_instead_of_waiting_forever():
    with socket.socket() as probe:  # a port nobody listens on once closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(StrategyError, match=f"cannot connect to 127.0.0.1:{port}"):
        resolve_strategy("tpu", tpu=f"grpc://127.0.0.1:{port}")


def test_malformed_grpc_address_names_the_expected_form():
    with pytest.raises(StrategyError, match="not a grpc://host:port address"):
        resolve_strategy("tpu", tpu="grpc://tpu-host")
