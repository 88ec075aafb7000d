"""StepCheckpoints: exact round trip, pruning, and every way a checkpoint can be unusable."""

import json

import keras
import numpy as np
import pytest

from keras_attn.training.step_checkpoints import CheckpointError
from keras_attn.training.step_checkpoints import StepCheckpoints

X = np.random.default_rng(0).normal(size=(4, 3)).astype("float32")
Y = np.random.default_rng(1).normal(size=(4, 2)).astype("float32")


def make_model(hidden=5):
    # Named layers: checkpoints match variables by path, and Keras' automatic names
    # (dense_1, dense_2...) depend on how many layers the process made before.
    inputs = keras.Input((3,), name="x")
    h = keras.layers.Dense(hidden, activation="relu", name="hidden")(inputs)
    h = keras.layers.Dropout(0.5, name="drop")(h)
    outputs = keras.layers.Dense(2, name="out")(h)
    model = keras.Model(inputs, outputs, name="tiny")
    model.compile(optimizer=keras.optimizers.AdamW(1e-2), loss="mse")
    model.optimizer.build(model.trainable_variables)
    return model


def train(model, steps):
    for _ in range(steps):
        model.train_on_batch(X, Y)


def state(model):
    return [np.array(v.numpy()) for v in model.variables + model.optimizer.variables]


def save(checkpoints, model, step, **extra):
    return checkpoints.save(model, model.optimizer, step, extra=extra or None)


def test_round_trip_of_model_optimizer_and_dropout_seed(tmp_path):
    model = make_model()
    train(model, 3)
    checkpoints = StepCheckpoints(tmp_path)
    path = save(checkpoints, model, 3, trainer_state={"step": 3, "history": [1.5]})
    saved = state(model)
    seed_paths = [v.path for v in model.variables if "seed_generator" in v.path]
    assert seed_paths  # the dropout's random state is a variable and is saved
    # What the next step would do from here: the dropout mask it draws and the weights.
    expected_output = np.asarray(model(X, training=True))
    train(model, 2)
    expected_after = state(model)
    assert any(not np.array_equal(a, b) for a, b in zip(saved, expected_after))

    meta = checkpoints.restore(path, model, model.optimizer)
    assert meta["step"] == 3 and meta["trainer_state"] == {"step": 3, "history": [1.5]}
    for a, b in zip(state(model), saved, strict=True):
        np.testing.assert_array_equal(a, b)
    assert int(model.optimizer.iterations) == 3
    # Resuming replays the same random draws and the same updates, bit for bit.
    np.testing.assert_array_equal(np.asarray(model(X, training=True)), expected_output)
    train(model, 2)
    for a, b in zip(state(model), expected_after, strict=True):
        np.testing.assert_array_equal(a, b)


def test_restore_into_a_fresh_model_in_a_fresh_session(tmp_path):
    keras.backend.clear_session()
    model = make_model()
    train(model, 2)
    checkpoints = StepCheckpoints(tmp_path)
    save(checkpoints, model, 2)
    saved = state(model)
    # A new process starts Keras' name counters afresh; clear_session does the same here.
    keras.backend.clear_session()
    fresh = make_model()
    meta = checkpoints.restore_latest(fresh, fresh.optimizer)
    assert meta is not None and meta["step"] == 2
    for a, b in zip(state(fresh), saved, strict=True):
        np.testing.assert_array_equal(a, b)


def test_restore_into_a_second_model_of_the_same_process(tmp_path):
    model = make_model()
    checkpoints = StepCheckpoints(tmp_path)
    save(checkpoints, model, 2)
    second = make_model()
    assert checkpoints.restore_latest(second, second.optimizer) is not None


def test_meta_records_every_variable(tmp_path):
    model = make_model()
    path = save(StepCheckpoints(tmp_path), model, 7, epoch=1)
    assert path.name == "step-00000007"
    meta = json.loads((path / "meta.json").read_text())
    assert meta["step"] == 7 and meta["epoch"] == 1 and len(meta["state_sha256"]) == 64
    variables = model.variables + model.optimizer.variables
    assert [v["path"] for v in meta["variables"]] == [v.path for v in variables]
    assert [tuple(v["shape"]) for v in meta["variables"]] == [tuple(v.shape) for v in variables]
    assert [v["owner"] for v in meta["variables"]] == (
        ["model"] * len(model.variables) + ["optimizer"] * len(model.optimizer.variables))
    with np.load(path / "state.npz") as arrays:
        assert len(arrays.files) == len(variables)


def test_model_without_optimizer(tmp_path):
    model = make_model()
    checkpoints = StepCheckpoints(tmp_path)
    checkpoints.save(model, None, step=1)
    kernel = model.get_layer("out").kernel
    saved = np.array(kernel.numpy())
    kernel.assign(np.zeros_like(saved))
    assert checkpoints.restore_latest(model, None)["step"] == 1
    np.testing.assert_array_equal(kernel.numpy(), saved)


def test_keep_n_prunes_the_oldest(tmp_path):
    model = make_model()
    checkpoints = StepCheckpoints(tmp_path, keep=2)
    for step in (5, 10, 15, 20, 100):
        save(checkpoints, model, step)
        assert len(checkpoints.paths()) <= 2
    assert [p.name for p in checkpoints.paths()] == ["step-00000020", "step-00000100"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000020", "step-00000100"]
    # Saving the same step again replaces it.
    save(checkpoints, model, 100)
    assert [p.name for p in checkpoints.paths()] == ["step-00000020", "step-00000100"]


def test_paths_are_ordered_by_step_number_and_ignore_other_entries(tmp_path):
    model = make_model()
    checkpoints = StepCheckpoints(tmp_path, keep=10)
    assert checkpoints.paths() == []
    assert StepCheckpoints(tmp_path / "missing").paths() == []
    for step in (900, 12000, 80):
        save(checkpoints, model, step)
    (tmp_path / "step-notanumber").mkdir()
    (tmp_path / "step-00000005").write_text("a file, not a checkpoint")
    (tmp_path / "notes").mkdir()
    assert [p.name for p in checkpoints.paths()] == [
        "step-00000080", "step-00000900", "step-00012000"]


def test_leftover_temporary_directory_is_ignored(tmp_path):
    model = make_model()
    checkpoints = StepCheckpoints(tmp_path)
    save(checkpoints, model, 4)
    # A process killed mid-write leaves its temporary directory, with partial files.
    leftover = tmp_path / ".step-00000008.tmp-99999"
    leftover.mkdir()
    (leftover / "state.npz").write_bytes(b"PK\x03\x04partial")
    assert [p.name for p in checkpoints.paths()] == ["step-00000004"]
    messages = []
    checkpoints.log = messages.append
    assert checkpoints.restore_latest(model, model.optimizer)["step"] == 4
    assert messages == []


def damage_truncate(path):
    data = (path / "state.npz").read_bytes()
    (path / "state.npz").write_bytes(data[: len(data) // 2])


def damage_remove_meta(path):
    (path / "meta.json").unlink()


def damage_remove_state(path):
    (path / "state.npz").unlink()


def damage_meta_not_json(path):
    (path / "meta.json").write_text('{"step": 8, "state_sha256": ')


def edit_meta(path, change):
    meta = json.loads((path / "meta.json").read_text())
    change(meta)
    (path / "meta.json").write_text(json.dumps(meta))


def damage_meta_checksum(path):
    edit_meta(path, lambda meta: meta.update(state_sha256="0" * 64))


def damage_meta_variable_path(path):
    edit_meta(path, lambda meta: meta["variables"][0].update(path="tiny/other/kernel"))


def damage_meta_variable_count(path):
    edit_meta(path, lambda meta: meta["variables"].pop())


def damage_state_unreadable_with_matching_checksum(path):
    import hashlib

    garbage = b"not a zip archive at all"
    (path / "state.npz").write_bytes(garbage)
    edit_meta(path, lambda meta: meta.update(state_sha256=hashlib.sha256(garbage).hexdigest()))


@pytest.mark.parametrize("damage, reason", [
    (damage_truncate, r"state\.npz: checksum mismatch \(file damaged or partial\)"),
    (damage_remove_meta, r"step-00000008: incomplete \(meta\.json or state\.npz missing\)"),
    (damage_remove_state, r"step-00000008: incomplete \(meta\.json or state\.npz missing\)"),
    (damage_meta_not_json, r"meta\.json: unreadable"),
    (damage_meta_checksum, r"state\.npz: checksum mismatch"),
    (damage_meta_variable_path, r"variable tiny/other/kernel \(3, 5\) does not match model "
                                r"variable hidden/kernel \(3, 5\)"),
    (damage_meta_variable_count, r"holds \d+ variables, the model and optimizer have \d+ "
                                 r"\(a different model or optimizer configuration\)"),
    (damage_state_unreadable_with_matching_checksum, r"state\.npz: unreadable"),
])
def test_unusable_checkpoint_raises_and_latest_falls_back(tmp_path, damage, reason):
    model = make_model()
    checkpoints = StepCheckpoints(tmp_path)
    train(model, 1)
    save(checkpoints, model, 4)
    good = state(model)
    train(model, 1)
    bad_path = save(checkpoints, model, 8)
    damage(bad_path)
    with pytest.raises(CheckpointError, match=reason):
        checkpoints.read(bad_path, model, model.optimizer)
    messages = []
    checkpoints.log = messages.append
    meta = checkpoints.restore_latest(model, model.optimizer)
    assert meta["step"] == 4
    for a, b in zip(state(model), good, strict=True):
        np.testing.assert_array_equal(a, b)
    assert len(messages) == 1 and messages[0].startswith("skipping unusable checkpoint: ")
    assert "step-00000008" in messages[0]


def test_model_with_different_shapes(tmp_path):
    model = make_model(hidden=5)
    checkpoints = StepCheckpoints(tmp_path)
    path = save(checkpoints, model, 1)
    other = make_model(hidden=6)  # same variables, same paths, other shapes
    before = state(other)
    with pytest.raises(CheckpointError, match=r"variable hidden/kernel \(3, 5\) does not "
                                              r"match model variable hidden/kernel \(3, 6\)"):
        checkpoints.restore(path, other, other.optimizer)
    for a, b in zip(state(other), before):  # nothing was assigned
        np.testing.assert_array_equal(a, b)


def test_other_optimizer_configuration(tmp_path):
    model = make_model()
    checkpoints = StepCheckpoints(tmp_path)
    path = save(checkpoints, model, 1)
    other = make_model()
    sgd = keras.optimizers.SGD(0.1, momentum=0.9)
    sgd.build(other.trainable_variables)
    with pytest.raises(CheckpointError, match="a different model or optimizer configuration"):
        checkpoints.read(path, other, sgd)


def test_restore_latest_returns_none_when_nothing_is_usable(tmp_path):
    model = make_model()
    checkpoints = StepCheckpoints(tmp_path)
    assert checkpoints.restore_latest(model, model.optimizer) is None  # no directory yet
    for step in (1, 2):
        damage_truncate(save(checkpoints, model, step))
    messages = []
    checkpoints.log = messages.append
    before = state(model)
    assert checkpoints.restore_latest(model, model.optimizer) is None
    assert [m.split("step-")[1][:8] for m in messages] == ["00000002", "00000001"]
    for a, b in zip(state(model), before):
        np.testing.assert_array_equal(a, b)


def test_milestones_are_kept_besides_the_newest(tmp_path):
    model = make_model()
    checkpoints = StepCheckpoints(tmp_path, keep=2, keep_milestones=3,
                                  is_milestone=lambda step: step % 10 == 0)
    for step in (4, 8, 10, 14, 18, 20, 24, 28, 30, 34, 38):
        save(checkpoints, model, step)
    kept = [int(p.name.split("-")[1]) for p in checkpoints.paths()]
    assert kept == [10, 20, 30, 34, 38]  # the 3 newest epoch ends + the 2 newest
    assert [int(p.name.split("-")[1]) for p in checkpoints.milestones()] == [10, 20, 30]


def test_average_weights_is_the_mean_of_the_saved_model_variables(tmp_path):
    model = make_model()
    checkpoints = StepCheckpoints(tmp_path, keep=5)
    saved, paths = [], []
    for step in (1, 2, 3):
        train(model, 2)
        saved.append([np.array(v.numpy()) for v in model.variables])
        paths.append(save(checkpoints, model, step))
    averaged = checkpoints.average_weights(paths[1:], model)
    assert len(averaged) == len(model.variables)
    for variable, value, second, third in zip(model.variables, averaged, saved[1], saved[2]):
        assert value.dtype == np.asarray(variable.numpy()).dtype
        if np.issubdtype(value.dtype, np.floating):
            np.testing.assert_allclose(value, (second + third) / 2, rtol=1e-6, atol=1e-7)
        else:  # the dropout's seed state: the last checkpoint's
            np.testing.assert_array_equal(value, third)
    # A checkpoint of another model is named, as when restoring.
    with pytest.raises(CheckpointError, match="variables of the model, the model has 2 "):
        checkpoints.average_weights(paths, keras.Sequential([keras.Input((3,)),
                                                             keras.layers.Dense(2)]))
    with pytest.raises(CheckpointError, match="no checkpoints to average"):
        checkpoints.average_weights([], model)


class Noisy(keras.layers.Layer):
    """A layer that owns a seed generator (like a Transformer block's dropout state): its
    variable path is `<layer>/seed_generator_<n>/...`, `n` counted per process."""

    def build(self, input_shape):
        # made in build(), under the layer's name scope, as a block's dropouts are
        self.seed_generator = keras.random.SeedGenerator(7)

    def call(self, x, training=False):
        noise = keras.random.normal(keras.ops.shape(x), seed=self.seed_generator)
        return x + 0.1 * noise if training else x


def noisy_model():
    inputs = keras.Input((3,), name="x")
    outputs = keras.layers.Dense(2, name="out")(Noisy(name="noisy")(inputs))
    return keras.Model(inputs, outputs, name="noisy_model")


def test_nested_seed_generators_numbered_by_the_process_still_match(tmp_path):
    model = noisy_model()
    checkpoints = StepCheckpoints(tmp_path)
    path = checkpoints.save(model, None, step=1)
    [keras.random.SeedGenerator(0) for _ in range(3)]  # the process counts on
    later = noisy_model()
    paths = [v.path for v in model.variables + later.variables if "seed_generator" in v.path]
    assert len(set(paths)) == 2 and all(p.startswith("noisy/seed_generator_") for p in paths)
    checkpoints.read(path, later, None, owners=("model",))
    checkpoints.restore(path, later, None)
    for a, b in zip(model.variables, later.variables, strict=True):
        np.testing.assert_array_equal(np.asarray(a.numpy()), np.asarray(b.numpy()))
