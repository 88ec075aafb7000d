/**
 * The page `benchmarks/web_latency.py` drives: keras-attn's exported files in LiteRT.js,
 * onnxruntime-web and MediaPipe on the same pre-tokenized sentences, one page per runtime
 * setting (thread count and LiteRT.js wasm build are fixed once a page loaded them).
 *
 * The job (JSON at `?job=URL`, written by web_latency.py) is one of:
 * - `latency`: load every route, warm each up, then in rounds: each chunk of sentences runs on
 *   every route in turn (the order rotates per chunk), so a busy moment of the machine hits
 *   all routes alike. Only the model call is timed: input tensors made, run, output read.
 * - `load`: one route on a cold page: runtime wasm, model fetch, compile and the first run.
 *
 * Routes: `litert` runs a `.tflite` on the `wasm` accelerator (XNNPACK), a file with length
 * buckets on the shortest signature that holds the tokens (inputs cut to it), a fixed-length
 * file padded to its length; `ort` runs an `.onnx` in onnxruntime-web's wasm backend at the
 * sentence's exact length (what transformers.js does); `mediapipe` runs a
 * `model_*_mediapipe.tflite` in `@mediapipe/tasks-text`'s TextClassifier on the text (its
 * call includes MediaPipe's own tokenizer). Every wasm file comes from this page's origin.
 *
 * The result (`window.benchResult`, or `window.benchError`) holds the times in ms, the length
 * each sentence ran at and the argmax of its logits (per token for a tagger).
 */
import { loadAndCompile, loadLiteRt, supportsFeature, Tensor } from "@litertjs/core";
import { FilesetResolver, TextClassifier } from "@mediapipe/tasks-text";
import * as ort from "onnxruntime-web/wasm";

type Runtime = "litert" | "ort" | "mediapipe";
type LiteRtBuild = "internal" | "compat" | "threaded";

interface RouteSpec {
  id: string;
  runtime: Runtime;
  url: string;
}

interface Sentence {
  ids: number[];
  text: string;
}

interface TaskSpec {
  name: string;
  tagger: boolean;
  sequenceLength: number;
  padId: number;
  numLabels: number;
  sentences: Sentence[];
  routes: RouteSpec[];
}

interface Job {
  mode: "latency" | "load";
  threads: number;
  litertBuild: LiteRtBuild;
  warmup: number;
  chunk: number;
  passes: number;
  tasks: TaskSpec[];
}

/** A route ready to run: `infer` is the timed call. */
interface Loaded {
  spec: RouteSpec;
  /** Signature lengths of a `.tflite`, shortest first; `[]` where the sentence's own is used. */
  lengths: number[];
  fetchMs: number;
  compileMs: number;
  modelBytes: number;
  /** Logits (probabilities for MediaPipe), flat, and the length the sentence ran at. */
  infer(sentence: Sentence): Promise<{ logits: Float32Array; length: number }>;
  close(): void;
}

declare global {
  interface Window {
    benchResult?: unknown;
    benchError?: string;
  }
}

const WASM = {
  litert: new URL("/wasm/litert/", location.href).href,
  ort: new URL("/wasm/ort/", location.href).href,
  mediapipe: new URL("/wasm/mediapipe", location.href).href,
};
const LITERT_FILES: Record<Exclude<LiteRtBuild, "threaded">, string> = {
  internal: "litert_wasm_internal.js",
  compat: "litert_wasm_compat_internal.js",
};

const runtimeMs: Partial<Record<Runtime, number>> = {};
let liteRtLoaded: Promise<void> | null = null;
let ortConfigured = false;

function log(message: string): void {
  console.log(`[bench] ${message}`);
  document.getElementById("log")!.textContent += `${message}\n`;
}

/** LiteRT.js' wasm, once per page: the build is forced by its `.js` file, threads by folder. */
function ensureLiteRt(job: Job): Promise<void> {
  liteRtLoaded ??= (async () => {
    const start = performance.now();
    if (job.litertBuild === "threaded") await loadLiteRt(WASM.litert, { threads: true });
    else await loadLiteRt(WASM.litert + LITERT_FILES[job.litertBuild]);
    runtimeMs.litert = performance.now() - start;
  })();
  return liteRtLoaded;
}

async function fetchBytes(url: string): Promise<Uint8Array> {
  const response = await fetch(url);
  if (!response.ok) throw new Error(`${url}: HTTP ${response.status}`);
  return new Uint8Array(await response.arrayBuffer());
}

function int32(values: ArrayLike<number>, length: number, fill: number): Int32Array {
  const array = new Int32Array(length).fill(fill);
  array.set(Array.prototype.slice.call(values, 0, length));
  return array;
}

/** The three id inputs of one sentence at `length` (pad id and zero mask past its tokens). */
function idInputs(sentence: Sentence, length: number, padId: number): Record<string, Int32Array> {
  const mask = new Int32Array(length);
  mask.fill(1, 0, Math.min(sentence.ids.length, length));
  return {
    token_ids: int32(sentence.ids, length, padId),
    segment_ids: new Int32Array(length),
    padding_mask: mask,
  };
}

async function loadLiteRtRoute(job: Job, task: TaskSpec, spec: RouteSpec): Promise<Loaded> {
  await ensureLiteRt(job);
  const t0 = performance.now();
  const bytes = await fetchBytes(spec.url);
  const t1 = performance.now();
  const compiled = await loadAndCompile(bytes, {
    accelerator: "wasm",
    cpuOptions: { numThreads: job.threads },
  });
  const t2 = performance.now();
  const signatures = Object.entries(compiled.signatures)
    .map(([key, runner]) => {
      const inputs = runner.getInputDetails();
      const ids = inputs.find((d) => d.name === "token_ids");
      if (!ids) throw new Error(`${spec.url}: signature ${key} has no token_ids input`);
      const outputs = runner.getOutputDetails();
      const output = (outputs.find((d) => d.name === "logits") ?? outputs[0]).name;
      return { key, length: ids.shape[1], names: inputs.map((d) => d.name), output };
    })
    .sort((a, b) => a.length - b.length);
  return {
    spec,
    lengths: signatures.map((s) => s.length),
    fetchMs: t1 - t0,
    compileMs: t2 - t1,
    modelBytes: bytes.length,
    async infer(sentence) {
      const n = sentence.ids.length;
      const signature = signatures.find((s) => s.length >= n) ?? signatures[signatures.length - 1];
      const arrays = idInputs(sentence, signature.length, task.padId);
      const tensors: Record<string, Tensor> = {};
      for (const name of signature.names) tensors[name] = new Tensor(arrays[name], [1, signature.length]);
      try {
        const outputs = await compiled.run(signature.key, tensors);
        try {
          const logits = Float32Array.from(outputs[signature.output].toTypedArray() as Float32Array);
          return { logits, length: signature.length };
        } finally {
          for (const tensor of Object.values(outputs)) tensor.delete();
        }
      } finally {
        for (const tensor of Object.values(tensors)) tensor.delete();
      }
    },
    close: () => compiled.delete(),
  };
}

async function loadOrtRoute(job: Job, spec: RouteSpec): Promise<Loaded> {
  if (!ortConfigured) {
    ort.env.wasm.wasmPaths = WASM.ort;
    ort.env.wasm.numThreads = job.threads;
    ort.env.logLevel = "error";
    ortConfigured = true;
  }
  const t0 = performance.now();
  const bytes = await fetchBytes(spec.url);
  const t1 = performance.now();
  // The first session also fetches and compiles onnxruntime-web's wasm.
  const session = await ort.InferenceSession.create(bytes, {
    executionProviders: ["wasm"],
    graphOptimizationLevel: "all",
  });
  const t2 = performance.now();
  const output = session.outputNames.includes("logits") ? "logits" : session.outputNames[0];
  return {
    spec,
    lengths: [],
    fetchMs: t1 - t0,
    compileMs: t2 - t1,
    modelBytes: bytes.length,
    async infer(sentence) {
      const n = sentence.ids.length;
      const arrays = idInputs(sentence, n, 0);
      const feeds: Record<string, ort.Tensor> = {};
      for (const name of session.inputNames) feeds[name] = new ort.Tensor("int32", arrays[name], [1, n]);
      const outputs = await session.run(feeds);
      const logits = outputs[output].data as Float32Array;
      return { logits, length: n };
    },
    close: () => void session.release(),
  };
}

async function loadMediaPipeRoute(task: TaskSpec, spec: RouteSpec): Promise<Loaded> {
  const t0 = performance.now();
  const bytes = await fetchBytes(spec.url);
  const t1 = performance.now();
  // Resolves the wasm file names only; createFromOptions fetches and compiles them.
  const fileset = await FilesetResolver.forTextTasks(WASM.mediapipe);
  const classifier = await TextClassifier.createFromOptions(fileset, {
    baseOptions: { modelAssetBuffer: bytes },
  });
  const t2 = performance.now();
  return {
    spec,
    lengths: [task.sequenceLength],
    fetchMs: t1 - t0,
    compileMs: t2 - t1,
    modelBytes: bytes.length,
    async infer(sentence) {
      const result = classifier.classify(sentence.text);
      const logits = new Float32Array(task.numLabels);
      for (const category of result.classifications[0].categories) logits[category.index] = category.score;
      return { logits, length: task.sequenceLength };
    },
    close: () => classifier.close(),
  };
}

function loadRoute(job: Job, task: TaskSpec, spec: RouteSpec): Promise<Loaded> {
  if (spec.runtime === "litert") return loadLiteRtRoute(job, task, spec);
  if (spec.runtime === "ort") return loadOrtRoute(job, spec);
  return loadMediaPipeRoute(task, spec);
}

function argmaxRows(logits: Float32Array, width: number, rows: number): number[] {
  const result: number[] = [];
  for (let r = 0; r < rows; r += 1) {
    let best = 0;
    for (let c = 1; c < width; c += 1) if (logits[r * width + c] > logits[r * width + best]) best = c;
    result.push(best);
  }
  return result;
}

function prediction(task: TaskSpec, sentence: Sentence, logits: Float32Array): number | number[] {
  if (!task.tagger) return argmaxRows(logits, task.numLabels, 1)[0];
  return argmaxRows(logits, task.numLabels, sentence.ids.length);
}

const yieldToEventLoop = () => new Promise((resolve) => setTimeout(resolve, 0));

/** One sentence per signature length the sentences use, then the first `warmup` sentences. */
function warmupSentences(task: TaskSpec, route: Loaded, warmup: number): Sentence[] {
  const picked: Sentence[] = [];
  const seen = new Set<number>();
  for (const sentence of task.sentences) {
    const n = sentence.ids.length;
    const length = route.lengths.find((l) => l >= n) ?? route.lengths[route.lengths.length - 1];
    if (length !== undefined && !seen.has(length)) {
      seen.add(length);
      picked.push(sentence);
    }
  }
  return [...picked, ...task.sentences.slice(0, warmup)];
}

async function latency(job: Job): Promise<unknown[]> {
  const results = [];
  for (const task of job.tasks) {
    const routes: Loaded[] = [];
    for (const spec of task.routes) {
      log(`${task.name}: loading ${spec.id}`);
      routes.push(await loadRoute(job, task, spec));
    }
    for (const route of routes) {
      for (const sentence of warmupSentences(task, route, job.warmup)) await route.infer(sentence);
    }
    const count = task.sentences.length;
    const times = routes.map(() => [] as number[]);
    const lengths = routes.map(() => new Array<number>(count).fill(0));
    const predictions = routes.map(() => new Array<number | number[]>(count).fill(-1));
    for (let pass = 0; pass < job.passes; pass += 1) {
      for (let begin = 0, round = 0; begin < count; begin += job.chunk, round += 1) {
        for (let k = 0; k < routes.length; k += 1) {
          const r = (k + round) % routes.length;
          for (let i = begin; i < Math.min(begin + job.chunk, count); i += 1) {
            const sentence = task.sentences[i];
            const start = performance.now();
            const { logits, length } = await routes[r].infer(sentence);
            times[r].push(performance.now() - start);
            if (pass === 0) {
              lengths[r][i] = length;
              predictions[r][i] = prediction(task, sentence, logits);
            }
          }
        }
        await yieldToEventLoop();
      }
      log(`${task.name}: pass ${pass + 1} of ${job.passes} done`);
    }
    results.push({
      name: task.name,
      routes: routes.map((route, r) => ({
        id: route.spec.id,
        signatureLengths: route.lengths,
        fetchMs: route.fetchMs,
        compileMs: route.compileMs,
        modelBytes: route.modelBytes,
        ms: times[r],
        lengths: lengths[r],
        predictions: predictions[r],
      })),
    });
    for (const route of routes) route.close();
  }
  return results;
}

async function load(job: Job): Promise<unknown[]> {
  const task = job.tasks[0];
  const spec = task.routes[0];
  const start = performance.now();
  const route = await loadRoute(job, task, spec);
  const ready = performance.now();
  await route.infer(task.sentences[0]);
  const end = performance.now();
  route.close();
  return [{
    name: task.name,
    routes: [{
      id: spec.id,
      runtimeMs: spec.runtime === "litert" ? runtimeMs.litert : null,
      fetchMs: route.fetchMs,
      compileMs: route.compileMs,
      loadMs: ready - start,
      firstRunMs: end - ready,
      modelBytes: route.modelBytes,
    }],
  }];
}

async function main(): Promise<void> {
  const jobUrl = new URLSearchParams(location.search).get("job");
  if (!jobUrl) throw new Error("open the page with ?job=URL of a job file of benchmarks/web_latency.py");
  const job = (await (await fetch(jobUrl)).json()) as Job;
  const environment = {
    userAgent: navigator.userAgent,
    hardwareConcurrency: navigator.hardwareConcurrency,
    crossOriginIsolated: globalThis.crossOriginIsolated,
    relaxedSimd: await supportsFeature("relaxedSimd"),
    ortVersion: ort.env.versions.web ?? ort.env.versions.common,
  };
  if (job.threads > 1 && !globalThis.crossOriginIsolated) {
    throw new Error("threads > 1 need a cross-origin isolated page (COOP/COEP headers)");
  }
  const tasks = job.mode === "load" ? await load(job) : await latency(job);
  window.benchResult = { environment, threads: job.threads, litertBuild: job.litertBuild, tasks };
  log("done");
}

main().catch((error: unknown) => {
  const message = error instanceof Error ? `${error.message}\n${error.stack ?? ""}` : String(error);
  log(`error: ${message}`);
  window.benchError = message;
});
