"""Training progress: a bar (or log lines when not on a terminal) and TensorBoard scalars."""

import sys
import time

import tensorflow as tf


def format_duration(seconds):
    """`"1h02m"`, `"4m05s"` or `"12s"`.

    >>> format_duration(3725), format_duration(245), format_duration(12.4)
    ('1h02m', '4m05s', '12s')
    """
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


class ProgressReporter:
    """Shows step, loss, learning rate, tokens/s and ETA; writes TensorBoard scalars.

    On a terminal the line is redrawn in place as a bar every step; otherwise (CI, log
    files) one line is written every `every` steps.

    Args:
        total_steps: micro-steps of the whole run.
        steps_per_epoch: micro-steps per epoch (to show the fractional epoch).
        every: steps between log lines and TensorBoard points.
        log: callable writing one line.
        summary_writer: a `tf.summary` writer or `None`.
        stream: where the bar is drawn. Defaults to `sys.stdout`.
    """

    def __init__(self, total_steps, steps_per_epoch, every, log, summary_writer=None,
                 stream=None):
        self.total_steps = total_steps
        self.steps_per_epoch = steps_per_epoch
        self.every = every
        self.log = log
        self.writer = summary_writer
        self.stream = stream or sys.stdout
        self.interactive = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.start(0)

    def start(self, step):
        """(Re)starts the clocks at `step` (after a resume or an evaluation)."""
        self._window_start = time.perf_counter()
        self._window_tokens = 0
        self._window_steps = 0
        self._run_start = time.perf_counter()
        self._run_steps = 0
        self._run_tokens = 0
        self.tokens_per_second = 0.0
        self.first_step = step

    def step(self, step, loss, tokens, learning_rate):
        """Records micro-step `step` (1-based count of steps done)."""
        self._window_tokens += tokens
        self._window_steps += 1
        self._run_steps += 1
        self._run_tokens += tokens
        done = step >= self.total_steps
        if not (self.interactive or step % self.every == 0 or done):
            return
        now = time.perf_counter()
        elapsed = max(now - self._window_start, 1e-9)
        rate = self._window_tokens / elapsed
        if step % self.every == 0 or done:
            self.tokens_per_second = rate
            self._window_start, self._window_tokens, self._window_steps = now, 0, 0
            if self.writer is not None:
                with self.writer.as_default(step=step):
                    tf.summary.scalar("train/loss", loss)
                    tf.summary.scalar("train/learning_rate", learning_rate)
                    tf.summary.scalar("train/tokens_per_second", rate)
        run_elapsed = max(now - self._run_start, 1e-9)
        eta = (self.total_steps - step) * run_elapsed / max(self._run_steps, 1)
        epoch = step / self.steps_per_epoch
        text = (f"step {step}/{self.total_steps} (epoch {epoch:.2f}) loss {loss:.4f} "
                f"lr {learning_rate:.2e} {self._run_tokens / run_elapsed:,.0f} tok/s "
                f"ETA {format_duration(eta)}")
        if self.interactive:
            width = 24
            filled = int(width * step / max(self.total_steps, 1))
            bar = "#" * filled + "." * (width - filled)
            self.stream.write(f"\r[{bar}] {text}  ")
            self.stream.flush()
            if done:
                self.stream.write("\n")
        else:
            self.log(f"  {text}")

    def end_line(self):
        """Ends an in-place bar before other output."""
        if self.interactive:
            self.stream.write("\n")
            self.stream.flush()

    @property
    def run_tokens(self):
        """Tokens of the steps since the last `start`."""
        return self._run_tokens

    @property
    def run_seconds(self):
        """Seconds since the last `start`."""
        return time.perf_counter() - self._run_start

    @property
    def run_tokens_per_second(self):
        return self._run_tokens / max(self.run_seconds, 1e-9)

    def scalars(self, step, values, prefix):
        """Writes a dict of numbers (evaluation metrics) to TensorBoard."""
        if self.writer is None:
            return
        with self.writer.as_default(step=step):
            for name, value in values.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    tf.summary.scalar(f"{prefix}/{name}", value)
        self.writer.flush()
