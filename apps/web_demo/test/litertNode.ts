/**
 * LiteRT.js in Node, for the library's tests on real `.tflite` files: its wasm loader is
 * written for a page (a `<script>` tag, or `importScripts` in a worker), and the Emscripten
 * module it loads takes Node's `require` and `__dirname` when it sees Node. These shims give
 * it both, and the wasm files come from node_modules/@litertjs/core/wasm/ (the compat build:
 * Node reports no relaxed SIMD to LiteRT.js' probe).
 */
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";
import { runInThisContext } from "node:vm";

import { ensureRuntime } from "../src/lib/runtime";

export const WASM_DIR = fileURLToPath(new URL("../node_modules/@litertjs/core/wasm/", import.meta.url));

/** Loads LiteRT.js once in this Node process (single-threaded, the `wasm` accelerator). */
export async function loadLiteRtInNode(): Promise<void> {
  const global = globalThis as Record<string, unknown>;
  global["self"] ??= globalThis;
  global["require"] ??= createRequire(import.meta.url);
  global["__dirname"] ??= WASM_DIR;
  global["importScripts"] ??= (url: string) => {
    const path = url.startsWith("file:") ? fileURLToPath(url) : url;
    runInThisContext(readFileSync(path, "utf-8"), { filename: path });
  };
  await ensureRuntime({ wasmPath: WASM_DIR });
}
