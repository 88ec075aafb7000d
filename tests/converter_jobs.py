"""Jobs for `tests/test_converter_process.py`: small functions the converter's child runs,
in a module that imports neither Keras nor TensorFlow (a child starts in a fraction of a
second)."""

import os
import pathlib
import time


def write_pid(path):
    pathlib.Path(path).write_text(str(os.getpid()))


def fail(message):
    print("some converter output")
    raise ValueError(message)


def die(code):
    os._exit(code)


def sleep(seconds):
    time.sleep(seconds)


def write_pid_and_sleep(path):
    write_pid(path)
    time.sleep(60)


def write_layer_name(path):
    import keras  # noqa: PLC0415 - only this job needs Keras

    pathlib.Path(path).write_text(keras.layers.Dense(1).name)
