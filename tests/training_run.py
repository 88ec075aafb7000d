"""Runs one training in a subprocess for the distributed and kill/resume tests.

    python -m tests.training_run SPEC.json

SPEC: {"config": {...TrainingConfig dict...}, "weights_out": path or null,
       "kill_at_step": int or null}. With `kill_at_step` the process SIGKILLs itself when the
progress log reaches that step (mid-training, after earlier checkpoints were written).
The final weights (`model.weights`, in order) go to `weights_out` as an `.npz`.
"""

import json
import os
import re
import signal
import sys


def main(path):
    with open(path, encoding="utf-8") as file:
        spec = json.load(file)
    import numpy as np

    from keras_attn.runs.training_config import TrainingConfig
    from keras_attn.stages.train_stage import Trainer

    kill_at = spec.get("kill_at_step")

    def log(line):
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
        match = re.match(r"\s*step (\d+)/", line)
        if kill_at is not None and match and int(match.group(1)) >= kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    config = TrainingConfig.from_dict(spec["config"])
    trainer = Trainer(config, log=log)
    results = trainer.run()
    if spec.get("weights_out"):
        np.savez(spec["weights_out"], *[np.asarray(v.numpy()) for v in trainer.model.weights])
    sys.stdout.write("RESULT " + json.dumps({"metric": results["metric"],
                                             "best_dev": results["best_dev"]}) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
