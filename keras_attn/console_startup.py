"""A quiet TensorFlow start-up for our own command line, and only for it.

TensorFlow's C++ runtime logs to the terminal while it loads: on a machine without a GPU,
"Could not find cuda drivers on your machine, GPU will not be used." (twice, each after
"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"),
"failed call to cuInit: ... UNKNOWN ERROR (303)", then INFO lines such as
`cpu_feature_guard.cc`, `fast_bert_normalizer_model_builder.cc` and
`generator_dataset_op.cc`. On CPUs where TensorFlow turns oneDNN on by default (AVX-512
VNNI or BF16, AMX), also "oneDNN custom operations are on ..." (twice) and, once per process
at the first eager int64 transpose (our tokenizer runs one), the error "oneDNN supports
DT_INT64 only on platforms with AVX-512. Falling back to the default Eigen-based
implementation if present." (it falls back, and the results are right). None of them is
something a user of `keras-attn` can act on.

`TF_CPP_MIN_LOG_LEVEL=2` (warnings and info off, errors kept) removes the INFO lines, but
TensorFlow reads it once, when it first logs, which is during `import tensorflow`; and the
CUDA stub lines come from an absl logger that ignores it. So when the process is our
command (`keras-attn ...` or `python -m keras_attn...`), `keras_attn/__init__.py` calls
`quiet_tensorflow_startup()` before anything imports Keras: it sets the level (unless the
user set one), then imports TensorFlow and looks for GPUs with stderr captured, and writes
back every captured line except the known start-up lines above; it runs one int64
transpose meanwhile, so that the oneDNN int64 line is logged then and left out. A program
that merely imports `keras_attn` is left alone: its environment and its stderr are its own.
"""

import os
import re
import sys
import tempfile

CONSOLE_SCRIPT = "keras-attn"

_ABSL_PREAMBLE = re.compile(
    r"WARNING: All log messages before absl::InitializeLog\(\) is called are written to "
    r"STDERR")
_NO_CUDA_DRIVER = re.compile(r"I\d{4} .*cudart_stub\.cc:\d+\] Could not find cuda drivers")
# Only noise when the CUDA stub said there is no driver: then no GPU is used anyway.
_CUINIT_FAILED = re.compile(r"E\d{4} .*cuda_platform\.cc:\d+\] failed call to cuInit")
_ONEDNN_ON = re.compile(r"I\d{4} .*port\.cc:\d+\] oneDNN custom operations are on\.")
_ONEDNN_INT64 = re.compile(r"E\d{4} .*util\.cc:\d+\] oneDNN supports DT_INT64 only on platforms "
                           r"with AVX-512\. Falling back to the default Eigen-based")


def started_as_our_command(argv=None, original_argv=None):
    """Whether this process is `keras-attn ...` or `python -m keras_attn[.module] ...`.

    Args:
        argv: `sys.argv` (its first item is the console script's path).
        original_argv: `sys.orig_argv`, the interpreter's own arguments (`-m MODULE`).
    Returns:
        bool.
    Example:
    >>> started_as_our_command(["/venv/bin/keras-attn", "demo"], ["python", "-c", "..."])
    True
    >>> started_as_our_command(["-m"], ["python", "-m", "keras_attn.cli", "export", "RUN"])
    True
    >>> started_as_our_command(["train.py"], ["python", "train.py"])
    False
    """
    argv = sys.argv if argv is None else argv
    original_argv = sys.orig_argv if original_argv is None else original_argv
    script = argv[0].replace("\\", "/").rsplit("/", 1)[-1].split(".")[0] if argv else ""
    if script in (CONSOLE_SCRIPT, f"{CONSOLE_SCRIPT}-script"):
        return True
    for flag, module in zip(original_argv, original_argv[1:]):
        if flag == "-m":
            return module == "keras_attn" or module.startswith("keras_attn.")
    return False


def startup_lines_worth_showing(lines):
    """The captured start-up `lines` minus the known TensorFlow start-up noise.

    >>> startup_lines_worth_showing([
    ...     "WARNING: All log messages before absl::InitializeLog() is called are written "
    ...     "to STDERR",
    ...     "I0000 00:00:17.7 22439 cudart_stub.cc:31] Could not find cuda drivers on your "
    ...     "machine, GPU will not be used.",
    ...     "E0000 00:00:17.9 22439 cuda_platform.cc:52] failed call to cuInit: INTERNAL",
    ...     "I0000 00:00:17.9 22439 port.cc:153] oneDNN custom operations are on. You may see "
    ...     "slightly different numerical results",
    ...     "E0000 00:00:17.9 22439 util.cc:131] oneDNN supports DT_INT64 only on platforms "
    ...     "with AVX-512. Falling back to the default Eigen-based implementation if present.",
    ...     "E0000 00:00:18.0 22439 some_kernel.cc:10] something the user should see"])
    ['E0000 00:00:18.0 22439 some_kernel.cc:10] something the user should see']
    """
    no_driver = any(_NO_CUDA_DRIVER.match(line) for line in lines)
    return [line for line in lines
            if not (any(noise.match(line) for noise in (_ABSL_PREAMBLE, _NO_CUDA_DRIVER,
                                                          _ONEDNN_ON, _ONEDNN_INT64))
                    or (no_driver and _CUINIT_FAILED.match(line)))]


def quiet_tensorflow_startup():
    """Sets `TF_CPP_MIN_LOG_LEVEL=2` unless set, then loads TensorFlow and its devices with
    the known start-up noise left out of stderr (everything else is written back)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        sys.stderr.flush()
        saved_stderr = os.dup(2)
    except (OSError, AttributeError, ValueError):
        return  # no usable stderr (closed, detached): nothing to keep quiet
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            # Imported here, not at the top: the environment above must be set first, and
            # only our command line loads TensorFlow this way.
            import tensorflow as tf

            # Initializes the CUDA platform now (its cuInit error lands in the capture).
            tf.config.list_physical_devices("GPU")
            # With oneDNN on, the first eager int64 transpose logs the DT_INT64 line (once
            # per process): here, not in the middle of our output.
            tf.transpose(tf.zeros((2, 3), tf.int64))
        finally:
            sys.stderr.flush()
            os.dup2(saved_stderr, 2)
            os.close(saved_stderr)
            captured.seek(0)
            lines = captured.read().decode("utf-8", "replace").splitlines()
            for line in startup_lines_worth_showing(lines):
                sys.stderr.write(line + "\n")
            sys.stderr.flush()
