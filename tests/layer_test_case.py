"""The one test routine every keras-attn layer goes through.

`run_layer_test` checks, for one layer configuration:
  1. eager call (shape, finiteness);
  2. `get_config` / `from_config` round trip, and identical outputs with copied weights;
  3. symbolic call inside a functional model, equal to the eager output;
  4. `.keras` save / load (`safe_mode=True`) with identical outputs;
  5. one `fit` step that changes the trainable weights and gives a finite loss;
  6. `mixed_bfloat16` and `mixed_float16`: float32 variables, half-precision outputs close
     to the float32 outputs of the same weights.
`assert_implicit_mask_matches_explicit` checks that a Keras mask (from `Masking`) and an
explicit `padding_mask` give the same outputs on real positions.
"""

import os
import tempfile

import keras
import numpy as np
from keras import ops

from tests.tolerances import float32_path_atol


def run_layer_test(
    layer_cls,
    init_kwargs,
    input_data,
    call_kwargs=None,
    expected_output_shape=None,
    run_fit=True,
    run_mixed_precision=True,
    mixed_precision_tolerance=0.1,
):
    """Runs the shared checks; returns the float32 output (first output) of the final weights.

    Args:
        layer_cls: the layer class.
        init_kwargs: dict of constructor arguments.
        input_data: a numpy array (the first positional input) or a dict whose first item
            is passed positionally and the rest by keyword. Array values become
            `keras.Input`s in the symbolic checks.
        call_kwargs: dict of non-tensor keyword arguments (flags such as
            `use_causal_mask=True`).
        expected_output_shape: optional shape of the first output.
        run_fit: whether to run the `fit` step (off for layers without weights).
        run_mixed_precision: whether to run the half-precision checks.
        mixed_precision_tolerance: max |float32 - half| relative to max |float32|.
    """
    call_kwargs = dict(call_kwargs or {})
    inputs = input_data if isinstance(input_data, dict) else {"inputs": input_data}
    names = list(inputs)

    def call(layer, tensors, training=None):
        args = [tensors[names[0]]]
        kwargs = {n: tensors[n] for n in names[1:]}
        if training is not None:
            kwargs["training"] = training
        return layer(*args, **kwargs, **call_kwargs)

    # 1. Eager call.
    layer = layer_cls(**init_kwargs)
    eager = _first(call(layer, inputs))
    eager_np = ops.convert_to_numpy(eager)
    if expected_output_shape is not None:
        assert tuple(eager_np.shape) == tuple(expected_output_shape), (
            eager_np.shape, expected_output_shape)
    if np.issubdtype(eager_np.dtype, np.floating):
        assert np.all(np.isfinite(eager_np)), "non-finite outputs"

    # 2. Config round trip and weight copy.
    config = layer.get_config()
    clone = layer_cls.from_config(config)
    assert clone.get_config() == config
    _first(call(clone, inputs))
    clone.set_weights(layer.get_weights())
    np.testing.assert_allclose(
        ops.convert_to_numpy(_first(call(clone, inputs))), eager_np, atol=1e-6, rtol=1e-6
    )
    registered = keras.saving.get_registered_name(layer_cls)
    assert registered.startswith("keras_attn>"), f"{layer_cls} is not registered: {registered}"

    # 3. Symbolic call in a functional model.
    symbolic = {
        n: keras.Input(shape=np.shape(v)[1:], dtype=str(np.asarray(v).dtype), name=n)
        for n, v in inputs.items()
    }
    model = keras.Model(symbolic, _first(call(layer, symbolic)))
    predicted = model.predict({n: np.asarray(v) for n, v in inputs.items()}, verbose=0)
    # Traced graph vs eager call, other kernels (tests/tolerances.py): sums over at most the
    # largest dimension seen, through at most a whole block (12 reductions in a row).
    reduction = max([*eager_np.shape[1:], *(d for v in inputs.values() for d in np.shape(v)[1:])])
    atol = float32_path_atol(eager_np, reduction=reduction, depth=12)
    np.testing.assert_allclose(predicted, eager_np, atol=atol, rtol=0)

    # 4. `.keras` save / load.
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.keras")
        model.save(path)
        loaded = keras.saving.load_model(path, safe_mode=True)
    reloaded = loaded.predict({n: np.asarray(v) for n, v in inputs.items()}, verbose=0)
    np.testing.assert_allclose(reloaded, predicted, atol=1e-6, rtol=1e-6)

    # 5. One fit step.
    if run_fit and layer.trainable_weights:
        before = [ops.convert_to_numpy(w).copy() for w in layer.trainable_weights]
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        target = np.random.default_rng(0).normal(size=predicted.shape).astype("float32")
        history = model.fit(
            {n: np.asarray(v) for n, v in inputs.items()}, target,
            batch_size=len(target), epochs=1, verbose=0,
        )
        assert np.isfinite(history.history["loss"][0])
        after = [ops.convert_to_numpy(w) for w in layer.trainable_weights]
        assert any(not np.allclose(b, a) for b, a in zip(before, after)), "fit changed nothing"

    # 6. Mixed precision.
    if run_mixed_precision:
        # The fit step above moved the weights: recompute the float32 reference.
        eager_np = ops.convert_to_numpy(_first(call(layer, inputs)))
        scale = max(float(np.max(np.abs(eager_np))), 1e-3)
        for policy in ("mixed_bfloat16", "mixed_float16"):
            half = layer_cls(**{**init_kwargs, "dtype": policy})
            _first(call(half, inputs))
            for w in half.weights:
                assert keras.backend.standardize_dtype(w.dtype) in ("float32", "int32", "bool"), (
                    policy, w.path, w.dtype)
            half.set_weights(layer.get_weights())
            out = _first(call(half, inputs))
            if np.issubdtype(eager_np.dtype, np.floating):
                assert keras.backend.standardize_dtype(out.dtype) == policy.split("_")[1], (
                    policy, out.dtype)
                diff = np.max(np.abs(ops.convert_to_numpy(ops.cast(out, "float32")) - eager_np))
                assert diff <= mixed_precision_tolerance * scale, (policy, diff, scale)
    return eager_np


def assert_implicit_mask_matches_explicit(layer, x, padding_mask, call_kwargs=None, atol=1e-5):
    """A Keras mask attached by `Masking` equals passing `padding_mask` explicitly.

    `x` is `(B, T, d)` with padded steps; they are zeroed so `Masking(0.0)` finds them.
    Only real (unpadded) positions are compared.
    """
    call_kwargs = call_kwargs or {}
    padding_mask = np.asarray(padding_mask, bool)
    x = np.where(padding_mask[..., None], x, 0.0).astype("float32")
    implicit = keras.layers.Masking(mask_value=0.0)(x)
    out_implicit = ops.convert_to_numpy(_first(layer(implicit, **call_kwargs)))
    out_explicit = ops.convert_to_numpy(
        _first(layer(x, padding_mask=padding_mask, **call_kwargs))
    )
    np.testing.assert_allclose(
        out_implicit[padding_mask], out_explicit[padding_mask], atol=atol, rtol=atol
    )


def _first(output):
    return output[0] if isinstance(output, (tuple, list)) else output
