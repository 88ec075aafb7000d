/**
 * LiteRT.js, loaded once per page from our own origin, and the checks a browser must pass
 * before it can run a keras-attn model (WebAssembly SIMD; threads need cross-origin isolation).
 */
import { isWebGPUSupported, loadLiteRt, supportsFeature } from "@litertjs/core";

/** How the runtime is loaded: once per page, the first `loadModel` decides. */
export interface RuntimeOptions {
  /**
   * URL of the folder holding LiteRT.js' wasm files (`litert_wasm_*_internal.{js,wasm}`).
   * Default: `litert-wasm/` beside the library module (where `npm run build` puts them).
   */
  wasmPath?: string;
  /**
   * CPU threads. Above 1 the threaded wasm build is loaded, which needs a cross-origin
   * isolated page (`Cross-Origin-Opener-Policy: same-origin` and
   * `Cross-Origin-Embedder-Policy: require-corp`) and relaxed SIMD. Default 1.
   */
  threads?: number;
  /** `"wasm"` (XNNPACK on the CPU, the default) or `"webgpu"` where the browser has it. */
  accelerator?: "wasm" | "webgpu";
}

/** A browser or page that cannot run the models, with what to do about it. */
export class RuntimeError extends Error {
  override name = "RuntimeError";
}

const WASM_FOLDER = "litert-wasm/";
// A function returning `i8x16.popcnt(i8x16.splat(0))`: valid only where WebAssembly SIMD is
// implemented (the probe of the wasm-feature-detect project).
const SIMD_PROBE = new Uint8Array([
  0, 97, 115, 109, 1, 0, 0, 0, 1, 5, 1, 96, 0, 1, 123, 3, 2, 1, 0, 10, 10, 1, 8, 0, 65, 0,
  253, 15, 253, 98, 11,
]);

let loaded: { promise: Promise<unknown>; threaded: boolean } | null = null;

/** The default wasm folder: `litert-wasm/` beside this module. */
export function defaultWasmPath(): string {
  return new URL(WASM_FOLDER, import.meta.url).href;
}

/** True when this browser's WebAssembly has SIMD (every LiteRT.js build needs it). */
export function hasWasmSimd(): boolean {
  return typeof WebAssembly === "object" && WebAssembly.validate(SIMD_PROBE);
}

/**
 * Loads LiteRT.js once (later calls return the first load; asking for threads after a
 * single-threaded load is an error, since the wasm build is fixed per page).
 *
 * @throws RuntimeError without WebAssembly SIMD, or threads without cross-origin isolation.
 */
export async function ensureRuntime(options: RuntimeOptions = {}): Promise<void> {
  const threaded = (options.threads ?? 1) > 1;
  if (loaded) {
    if (threaded && !loaded.threaded) {
      throw new RuntimeError(
        "LiteRT.js is already loaded single-threaded on this page: pass `threads` to the " +
          "first loadModel call, or reload the page");
    }
    await loaded.promise;
    return;
  }
  await checkBrowser(options, threaded);
  // LiteRT's C++ logging reaches the page through Emscripten's `printErr` (console.error by
  // default): route it by severity, so that a working page logs no console errors.
  (globalThis as { Module?: object }).Module = { print: routeLog, printErr: routeLog };
  const promise = loadLiteRt(options.wasmPath ?? defaultWasmPath(), { threads: threaded });
  loaded = { promise, threaded };
  try {
    await promise;
  } catch (error) {
    loaded = null;
    throw new RuntimeError(
      `LiteRT.js could not load its wasm from ${options.wasmPath ?? defaultWasmPath()} ` +
        `(${(error as Error).message}): serve apps/web_demo/dist/litert-wasm/ beside the ` +
        "library, or pass `wasmPath`");
  }
}

/** One line of LiteRT's log, to the console method of its severity. */
export function routeLog(line: string): void {
  // Browsers have no NPU: LiteRT says so at every start, as a warning; it is not one here.
  if (/^INFO:|^VERBOSE:|NPU accelerator could not be loaded/.test(line)) console.debug(line);
  else if (/^WARNING:/.test(line)) console.warn(line);
  else console.error(line);
}

async function checkBrowser(options: RuntimeOptions, threaded: boolean): Promise<void> {
  if (!hasWasmSimd()) {
    throw new RuntimeError(
      "this browser has no WebAssembly SIMD, which LiteRT.js needs: use a current Chrome, " +
        "Edge, Firefox or Safari (16.4 or later)");
  }
  if (threaded) {
    if (!globalThis.crossOriginIsolated) {
      throw new RuntimeError(
        `threads=${options.threads} needs a cross-origin isolated page (serve it with ` +
          "Cross-Origin-Opener-Policy: same-origin and Cross-Origin-Embedder-Policy: " +
          "require-corp, as `make web` does), or use threads=1");
    }
    if (!(await supportsFeature("relaxedSimd"))) {
      throw new RuntimeError(
        "LiteRT.js' threaded build needs WebAssembly relaxed SIMD, which this browser " +
          "lacks: use threads=1");
    }
  }
  if (options.accelerator === "webgpu" && !isWebGPUSupported()) {
    throw new RuntimeError(
      'accelerator "webgpu" asked for, but this browser has no WebGPU: use "wasm"');
  }
}
