/**
 * The translation page `benchmarks/web_translation_latency.py` drives (bench/translation.html):
 * a keras-attn translation export's `.tflite` files in LiteRT.js through the library's
 * `loadTranslator`, and its ONNX encoder + decoder-with-past pair in onnxruntime-web (the
 * transformers.js route), both decoded by the library's greedy and beam search
 * (`src/lib/core/decoding.ts`), on the same source ids (tokenized in Python).
 *
 * The job (JSON at `?job=URL`) lists the routes, the sentences and the beam widths. Every route
 * is loaded and warmed up; then for each beam width the sentences run in chunks of `chunk`:
 * each chunk on every route in turn, the order rotating per chunk, so a busy moment of the
 * machine hits all routes alike. A sentence's time is the whole translation: encoder, every
 * decoding step and the search. 1 thread unless the job says otherwise; every wasm file comes
 * from the page's own origin.
 *
 * `ort` (`OrtTranslator` below): the encoder runs at the source's own length (ONNX has dynamic
 * axes), then one decoder-step call per step for all live beams at once (batch = beams), the
 * self-attention caches of the rows stacked into the batch and split again from
 * `present_self_attention_cache`: what transformers.js does with a decoder-with-past model.
 *
 * The result (`window.benchResult`, or `window.benchError`): per beam width and route, the ms
 * and the generated ids (EOS excluded; `eos` whether it was reached) of each sentence.
 */
import { type CompiledModel, loadAndCompile, Tensor } from "@litertjs/core";
import * as ort from "onnxruntime-web/wasm";

import { type DecodeStep, beamSearch, greedyDecode } from "../src/lib/core/decoding";
import { readTranslationAssets, sourceBucket } from "../src/lib/core/translationFile";
import { ensureRuntime } from "../src/lib/runtime";
import { loadTranslator } from "../src/lib/translator";

interface RouteSpec {
  id: string;
  /**
   * `litert`: the library's `loadTranslator`; `litert-beams`: the same file through this
   * page's adapter that runs a step's beams in one `decode_step_{S}_beams_{K}` call (what the
   * library does not do yet); `ort`: the ONNX pair.
   */
  runtime: "litert" | "litert-beams" | "ort";
  /** The `.tflite` file, or the ONNX encoder. */
  url: string;
  /** The ONNX decoder step (`ort`). */
  stepUrl?: string;
  /** The self-attention cache of one row, `(N, 2, M, h, dk)` (`ort`). */
  cacheShape?: number[];
}

interface DecodingCard {
  bosTokenId: number;
  eosTokenId: number;
  padTokenId: number;
  targetMaxLength: number;
  lengthPenalty: number;
  /** The `.tflite` files' source length buckets (the warm-up runs one sentence of each). */
  sourceLengths: number[];
}

interface Job {
  threads: number;
  warmup: number;
  chunk: number;
  beams: number[];
  card: DecodingCard;
  /** Source ids (`[SEP]` last), as Python's `Translator.source_ids`. */
  sentences: number[][];
  routes: RouteSpec[];
}

interface Output {
  /** Generated ids, EOS excluded. */
  tokens: number[];
  /** Whether the translation ended with EOS (it is then one more generated token). */
  eos: boolean;
  encodeMs: number;
  /** Time inside the model-step callbacks (NaN where the library runs them: `litert`). */
  stepMs: number;
}

interface Loaded {
  spec: RouteSpec;
  fetchMs: number;
  compileMs: number;
  modelBytes: number;
  translate(ids: Int32Array, beams: number): Promise<Output>;
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
};

function log(message: string): void {
  console.log(`[bench] ${message}`);
  document.getElementById("log")!.textContent += `${message}\n`;
}

async function fetchBytes(url: string): Promise<Uint8Array> {
  const response = await fetch(url);
  if (!response.ok) throw new Error(`${url}: HTTP ${response.status}`);
  return new Uint8Array(await response.arrayBuffer());
}

/** Ids up to the first EOS (excluded). */
function untilEos(ids: ArrayLike<number>, eos: number): Output["tokens"] {
  const all = Array.from(ids);
  const end = all.indexOf(eos);
  return end >= 0 ? all.slice(0, end) : all;
}

async function loadLiteRtRoute(job: Job, spec: RouteSpec): Promise<Loaded> {
  const t0 = performance.now();
  const bytes = await fetchBytes(spec.url);
  const t1 = performance.now();
  // The first load also loads LiteRT.js' wasm (from /wasm/litert/ on this origin).
  const translator = await loadTranslator(bytes, { name: spec.id, wasmPath: WASM.litert, threads: job.threads });
  const t2 = performance.now();
  return {
    spec,
    fetchMs: t1 - t0,
    compileMs: t2 - t1,
    modelBytes: bytes.length,
    async translate(ids, beams) {
      const out = await translator.translateIds(ids, { beams, maxLength: job.card.targetMaxLength });
      const tokens = Array.from(out.tokens);
      return { tokens, eos: tokens.length < job.card.targetMaxLength, encodeMs: out.timing.encodeMs, stepMs: NaN };
    },
    close: () => translator.delete(),
  };
}

type Inputs = Record<string, [Int32Array | Float32Array, number[]]>;

/** Runs one signature of a compiled file on typed arrays; every output as a float32 copy. */
async function runSignature(compiled: CompiledModel, key: string, inputs: Inputs): Promise<Record<string, Float32Array>> {
  const tensors: Record<string, Tensor> = {};
  for (const [name, [data, shape]] of Object.entries(inputs)) tensors[name] = new Tensor(data, shape);
  try {
    const outputs = await compiled.run(key, tensors);
    try {
      const result: Record<string, Float32Array> = {};
      for (const [name, tensor] of Object.entries(outputs)) {
        result[name] = Float32Array.from(tensor.toTypedArray() as Float32Array);
      }
      return result;
    } finally {
      for (const tensor of Object.values(outputs)) tensor.delete();
    }
  } finally {
    for (const tensor of Object.values(tensors)) tensor.delete();
  }
}

/** `rows` copies of `data` one after another. */
function repeatRows<T extends Int32Array | Float32Array>(data: T, rows: number): T {
  const out = new (data.constructor as new (n: number) => T)(rows * data.length);
  for (let r = 0; r < rows; r++) out.set(data, r * data.length);
  return out;
}

/**
 * A translation `.tflite` file as `TranslationModel` runs it (same buckets, inputs and copies),
 * except that a step of K > 1 beams is one call of the file's `decode_step_{S}_beams_{K}`
 * signature (the rows' caches stacked), as Python's `TranslationFile` does.
 */
async function loadLiteRtBeamsRoute(job: Job, spec: RouteSpec): Promise<Loaded> {
  const t0 = performance.now();
  const bytes = await fetchBytes(spec.url);
  const t1 = performance.now();
  await ensureRuntime({ wasmPath: WASM.litert, threads: job.threads });
  const { card } = await readTranslationAssets(bytes, spec.id);
  const compiled = await loadAndCompile(bytes, { accelerator: "wasm", cpuOptions: { numThreads: job.threads } });
  const t2 = performance.now();
  const signatures = card.raw["signatures"] as Record<string, string> | undefined;
  const beamsTemplate = signatures?.["beams_step"] ?? "decode_step_{S}_beams_{K}";
  const key = (template: string, length: number, rows = 0) =>
    template.replace("{S}", String(length)).replace("{K}", String(rows));
  const firstStep = compiled.signatures[key(card.decodeStepSignature, card.sourceLengths[0]!)]!;
  // One row's self-attention cache, (N, 2, M, h, dk): the signature's shape without its batch.
  const cacheShape = Array.from(firstStep.getInputDetails().find((d) => d.name === "self_attention_cache")!.shape).slice(1);
  const size = cacheShape.reduce((a, b) => a * b, 1);
  return {
    spec,
    fetchMs: t1 - t0,
    compileMs: t2 - t1,
    modelBytes: bytes.length,
    async translate(ids, beams) {
      const length = sourceBucket(card, ids.length);
      const start = performance.now();
      const tokenIds = new Int32Array(length).fill(card.padTokenId);
      tokenIds.set(ids);
      const mask = new Int32Array(length).fill(1, 0, ids.length);
      const cross = (await runSignature(compiled, key(card.encodeSignature, length), {
        encoder_token_ids: [tokenIds, [1, length]],
        encoder_padding_mask: [mask, [1, length]],
      }))["cross_attention_cache"]!;
      const encodeMs = performance.now() - start;
      const crossShape = [2 * cacheShape[0]!, length, ...cacheShape.slice(3)];
      const perRows = new Map<number, { cross: Float32Array; mask: Int32Array }>();
      const step: DecodeStep<Float32Array> = async (tokens, index, caches) => {
        const rows = tokens.length;
        const batched = key(beamsTemplate, length, rows);
        if (rows > 1 && compiled.signatures[batched]) {
          let repeated = perRows.get(rows);
          if (!repeated) {
            repeated = { cross: repeatRows(cross, rows), mask: repeatRows(mask, rows) };
            perRows.set(rows, repeated);
          }
          const self = new Float32Array(rows * size);
          for (let r = 0; r < rows; r++) self.set(caches[r]!, r * size);
          const out = await runSignature(compiled, batched, {
            decoder_token_ids: [Int32Array.from(tokens), [rows, 1]],
            cache_update_index: [new Int32Array(rows).fill(index), [rows]],
            self_attention_cache: [self, [rows, ...cacheShape]],
            cross_attention_cache: [repeated.cross, [rows, ...crossShape]],
            encoder_padding_mask: [repeated.mask, [rows, length]],
          });
          const logits = out["logits"]!;
          const present = out["self_attention_cache"]!;
          const vocab = logits.length / rows;
          return {
            logits: Array.from({ length: rows }, (_, r) => logits.subarray(r * vocab, (r + 1) * vocab)),
            caches: Array.from({ length: rows }, (_, r) => present.subarray(r * size, (r + 1) * size)),
          };
        }
        const logits: Float32Array[] = [];
        const next: Float32Array[] = [];
        for (let row = 0; row < rows; row++) {
          const out = await runSignature(compiled, key(card.decodeStepSignature, length), {
            decoder_token_ids: [Int32Array.of(tokens[row]!), [1, 1]],
            cache_update_index: [Int32Array.of(index), [1]],
            self_attention_cache: [caches[row]!, [1, ...cacheShape]],
            cross_attention_cache: [cross, [1, ...crossShape]],
            encoder_padding_mask: [mask, [1, length]],
          });
          logits.push(out["logits"]!);
          next.push(out["self_attention_cache"]!);
        }
        return { logits, caches: next };
      };
      const settings = { bosTokenId: card.bosTokenId, eosTokenId: card.eosTokenId, padTokenId: card.padTokenId,
        maxNewTokens: job.card.targetMaxLength };
      const empty = new Float32Array(size);
      const [timedStep, stepMs] = timed(step);
      const decoded = beams === 1
        ? await greedyDecode(timedStep, empty, settings)
        : await beamSearch(timedStep, empty, { ...settings, numBeams: beams, lengthPenalty: card.lengthPenalty });
      const out = untilEos(decoded.tokens, card.eosTokenId);
      return { tokens: out, eos: out.length < job.card.targetMaxLength, encodeMs, stepMs: stepMs() };
    },
    close: () => compiled.delete(),
  };
}

/**
 * The ONNX encoder + decoder-with-past pair in onnxruntime-web, decoded by the library's
 * search: the adapter a page using transformers.js' route would write.
 */
class OrtTranslator {
  private readonly cacheSize: number;

  constructor(
    private readonly encoder: ort.InferenceSession,
    private readonly decoder: ort.InferenceSession,
    private readonly cacheShape: number[],
    private readonly card: DecodingCard,
  ) {
    this.cacheSize = cacheShape.reduce((a, b) => a * b, 1);
  }

  async translate(ids: Int32Array, beams: number): Promise<Output> {
    const n = ids.length;
    const t0 = performance.now();
    const mask = new Int32Array(n).fill(1);
    const encoded = await this.encoder.run({
      encoder_token_ids: new ort.Tensor("int32", ids, [1, n]),
      encoder_padding_mask: new ort.Tensor("int32", mask, [1, n]),
    });
    const crossTensor = encoded["cross_attention_cache"]!;
    const cross = crossTensor.data as Float32Array;
    const crossDims = Array.from(crossTensor.dims); // (1, 2N, n, h, dk)
    const encodeMs = performance.now() - t0;
    // The cross cache and mask of `rows` rows (the source repeated), made once per row count.
    const perRows = new Map<number, { cross: ort.Tensor; mask: ort.Tensor }>();
    const repeated = (rows: number) => {
      let entry = perRows.get(rows);
      if (!entry) {
        entry = {
          cross: new ort.Tensor("float32", repeatRows(cross, rows), [rows, ...crossDims.slice(1)]),
          mask: new ort.Tensor("int32", repeatRows(mask, rows), [rows, n]),
        };
        perRows.set(rows, entry);
      }
      return entry;
    };
    const size = this.cacheSize;
    const step: DecodeStep<Float32Array> = async (tokens, index, caches) => {
      const rows = tokens.length;
      const self = new Float32Array(rows * size);
      for (let r = 0; r < rows; r++) self.set(caches[r]!, r * size);
      const { cross: crossRows, mask: maskRows } = repeated(rows);
      const out = await this.decoder.run({
        decoder_token_ids: new ort.Tensor("int32", Int32Array.from(tokens), [rows, 1]),
        cache_update_index: new ort.Tensor("int32", new Int32Array(rows).fill(index), [rows]),
        self_attention_cache: new ort.Tensor("float32", self, [rows, ...this.cacheShape]),
        cross_attention_cache: crossRows,
        encoder_padding_mask: maskRows,
      });
      const logits = out["logits"]!.data as Float32Array;
      const present = out["present_self_attention_cache"]!.data as Float32Array;
      const vocab = logits.length / rows;
      // Views of this call's fresh output buffers: the search never changes a cache in place.
      return {
        logits: Array.from({ length: rows }, (_, r) => logits.subarray(r * vocab, (r + 1) * vocab)),
        caches: Array.from({ length: rows }, (_, r) => present.subarray(r * size, (r + 1) * size)),
      };
    };
    const card = this.card;
    const settings = { bosTokenId: card.bosTokenId, eosTokenId: card.eosTokenId, padTokenId: card.padTokenId,
      maxNewTokens: card.targetMaxLength };
    const empty = new Float32Array(size);
    const [timedStep, stepMs] = timed(step);
    const decoded = beams === 1
      ? await greedyDecode(timedStep, empty, settings)
      : await beamSearch(timedStep, empty, { ...settings, numBeams: beams, lengthPenalty: card.lengthPenalty });
    const tokens = untilEos(decoded.tokens, card.eosTokenId);
    return { tokens, eos: tokens.length < card.targetMaxLength, encodeMs, stepMs: stepMs() };
  }
}

let ortConfigured = false;

async function loadOrtRoute(job: Job, spec: RouteSpec): Promise<Loaded> {
  if (!spec.stepUrl || !spec.cacheShape) throw new Error(`${spec.id}: an ort route needs stepUrl and cacheShape`);
  if (!ortConfigured) {
    ort.env.wasm.wasmPaths = WASM.ort;
    ort.env.wasm.numThreads = job.threads;
    ort.env.logLevel = "error";
    ortConfigured = true;
  }
  const t0 = performance.now();
  const encoderBytes = await fetchBytes(spec.url);
  const stepBytes = await fetchBytes(spec.stepUrl);
  const t1 = performance.now();
  const options: ort.InferenceSession.SessionOptions = { executionProviders: ["wasm"], graphOptimizationLevel: "all" };
  // The first session also fetches and compiles onnxruntime-web's wasm.
  const encoder = await ort.InferenceSession.create(encoderBytes, options);
  const decoder = await ort.InferenceSession.create(stepBytes, options);
  const t2 = performance.now();
  const translator = new OrtTranslator(encoder, decoder, spec.cacheShape, job.card);
  return {
    spec,
    fetchMs: t1 - t0,
    compileMs: t2 - t1,
    modelBytes: encoderBytes.length + stepBytes.length,
    translate: (ids, beams) => translator.translate(ids, beams),
    close: () => {
      void encoder.release();
      void decoder.release();
    },
  };
}

/** `step` timed: `[the same step, () => ms spent in it so far]`. */
function timed<C>(step: DecodeStep<C>): [DecodeStep<C>, () => number] {
  let ms = 0;
  const wrapped: DecodeStep<C> = async (tokens, index, caches) => {
    const start = performance.now();
    try {
      return await step(tokens, index, caches);
    } finally {
      ms += performance.now() - start;
    }
  };
  return [wrapped, () => ms];
}

const yieldToEventLoop = () => new Promise((resolve) => setTimeout(resolve, 0));

async function run(job: Job): Promise<unknown> {
  const routes: Loaded[] = [];
  for (const spec of job.routes) {
    log(`loading ${spec.id}`);
    routes.push(spec.runtime === "litert" ? await loadLiteRtRoute(job, spec)
      : spec.runtime === "litert-beams" ? await loadLiteRtBeamsRoute(job, spec)
        : await loadOrtRoute(job, spec));
  }
  const sentences = job.sentences.map((ids) => Int32Array.from(ids));
  // Warm-up: every route, every beam width, every source bucket's first sentence and then
  // the first `warmup` sentences.
  const buckets = new Set<number>();
  const firsts = sentences.filter((ids) => {
    const bucket = job.card.sourceLengths.find((n) => n >= ids.length) ?? Infinity;
    if (buckets.has(bucket)) return false;
    buckets.add(bucket);
    return true;
  });
  for (const route of routes) {
    for (const beams of job.beams) {
      for (const ids of [...firsts, ...sentences.slice(0, job.warmup)]) await route.translate(ids, beams);
    }
    log(`warmed up ${route.spec.id}`);
  }
  const perBeams = [];
  for (const beams of job.beams) {
    const count = sentences.length;
    const ms = routes.map(() => new Array<number>(count).fill(0));
    const outputs = routes.map(() => new Array<Output | null>(count).fill(null));
    for (let begin = 0, round = 0; begin < count; begin += job.chunk, round += 1) {
      for (let k = 0; k < routes.length; k += 1) {
        const r = (k + round) % routes.length;
        for (let i = begin; i < Math.min(begin + job.chunk, count); i += 1) {
          const start = performance.now();
          const output = await routes[r]!.translate(sentences[i]!, beams);
          ms[r]![i] = performance.now() - start;
          outputs[r]![i] = output;
        }
      }
      await yieldToEventLoop();
    }
    log(`${beams} beam(s) done`);
    perBeams.push({
      beams,
      routes: routes.map((route, r) => ({
        id: route.spec.id,
        ms: ms[r],
        encodeMs: outputs[r]!.map((o) => o!.encodeMs),
        stepMs: outputs[r]!.map((o) => o!.stepMs),
        tokens: outputs[r]!.map((o) => o!.tokens),
        eos: outputs[r]!.map((o) => o!.eos),
      })),
    });
  }
  const loaded = routes.map((route) => ({
    id: route.spec.id, fetchMs: route.fetchMs, compileMs: route.compileMs, modelBytes: route.modelBytes,
  }));
  for (const route of routes) route.close();
  return { routes: loaded, beams: perBeams };
}

async function main(): Promise<void> {
  const jobUrl = new URLSearchParams(location.search).get("job");
  if (!jobUrl) throw new Error("open the page with ?job=URL of a job of benchmarks/web_translation_latency.py");
  const job = (await (await fetch(jobUrl)).json()) as Job;
  if (job.threads > 1 && !globalThis.crossOriginIsolated) {
    throw new Error("threads > 1 need a cross-origin isolated page (COOP/COEP headers)");
  }
  const environment = {
    userAgent: navigator.userAgent,
    hardwareConcurrency: navigator.hardwareConcurrency,
    crossOriginIsolated: globalThis.crossOriginIsolated,
    ortVersion: ort.env.versions.web ?? ort.env.versions.common,
  };
  const result = await run(job);
  window.benchResult = { environment, threads: job.threads, ...(result as object) };
  log("done");
}

main().catch((error: unknown) => {
  const message = error instanceof Error ? `${error.message}\n${error.stack ?? ""}` : String(error);
  log(`error: ${message}`);
  window.benchError = message;
});
