/**
 * Where the golden vectors come from: `$GOLDEN_ROOT`, or a fresh set written into a temporary
 * directory by `apps/android_demo/tools/make_golden_vectors.py` with the project's Python
 * (`$PYTHON`, default `.venv/bin/python` of the repository), as
 * `apps/android_demo/core/run_jvm_tests.sh` does. Also runs `test/predict_results.py`, the
 * results `keras-attn predict --json` prints for the golden texts.
 */
import { spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, readdirSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

export const REPO = fileURLToPath(new URL("../../..", import.meta.url));
const GENERATOR = "apps/android_demo/tools/make_golden_vectors.py";
const PREDICT_RESULTS = "apps/web_demo/test/predict_results.py";

/** The golden vectors and the Python results of one test run. */
export interface GoldenData {
  /** The golden root: model directories with `model_card.json` and `golden_vectors.jsonl`. */
  root: string;
  /** `<model directory name>.jsonl` files of `predict_results.py`. */
  predictResults: string;
  /** Removes what was written here. */
  cleanUp(): void;
}

/** The project's Python: `$PYTHON`, default `.venv/bin/python` of the repository. */
export function python(): string {
  return process.env["PYTHON"] ?? join(REPO, ".venv/bin/python");
}

function run(script: string, args: string[]): void {
  const started = Date.now();
  const result = spawnSync(python(), [script, ...args], {
    cwd: REPO,
    encoding: "utf-8",
    env: { ...process.env, TF_CPP_MIN_LOG_LEVEL: "2" },
  });
  if (result.error !== undefined || result.status !== 0) {
    const why = result.error?.message ?? `exit status ${result.status}\n${(result.stderr ?? "").slice(-2000)}`;
    throw new Error(
      `cannot run ${python()} ${script} (${why}).\nThe golden tests need golden vectors: set GOLDEN_ROOT=DIR ` +
        `(written by \`python ${GENERATOR} DIR\` or \`keras-attn export\`), or PYTHON=the project's Python ` +
        "(default .venv/bin/python of the repository, made by `make install`).",
    );
  }
  const seconds = Math.round((Date.now() - started) / 1000);
  console.log(`${script} (${seconds} s): ${result.stdout.trim().split("\n").join("; ")}`);
}

/** Writes (or finds) the golden vectors and the Python predict results. */
export function goldenData(): GoldenData {
  const work = mkdtempSync(join(tmpdir(), "keras-attn-golden-"));
  const given = process.env["GOLDEN_ROOT"];
  if (given !== undefined && !(existsSync(given) && statSync(given).isDirectory())) {
    throw new Error(`GOLDEN_ROOT=${given} is not a directory`);
  }
  const cleanUp = () => rmSync(work, { recursive: true, force: true });
  const root = given ?? join(work, "golden");
  const predictResults = join(work, "predict");
  try {
    if (given === undefined) run(GENERATOR, [root]);
    run(PREDICT_RESULTS, [root, predictResults]);
  } catch (error) {
    cleanUp();
    throw error;
  }
  return { root, predictResults, cleanUp };
}

/** Model directories under `root` (the root itself included), sorted by name. */
export function modelDirectories(root: string): string[] {
  const isModel = (dir: string) =>
    existsSync(join(dir, "model_card.json")) && existsSync(join(dir, "golden_vectors.jsonl"));
  const children = readdirSync(root, { withFileTypes: true })
    .filter((entry) => entry.isDirectory())
    .map((entry) => join(root, entry.name))
    .sort();
  return [root, ...children].filter(isModel);
}
