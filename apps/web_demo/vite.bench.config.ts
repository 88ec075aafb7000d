// The browser benchmark's pages (bench/bench.html, benchmarks/web_latency.py drives it;
// bench/translation.html, benchmarks/web_translation_latency.py drives it), built to
// dist-bench/. The runtimes' wasm files are not copied: web_latency.py's server serves them
// from node_modules (/wasm/litert/, /wasm/ort/, /wasm/mediapipe/) on the page's own origin.
import { fileURLToPath } from "node:url";
import { defineConfig } from "vite";

export default defineConfig({
  root: "bench",
  base: "./",
  // onnxruntime-web's build that loads its wasm glue (ort-wasm-simd-threaded.mjs) from
  // `ort.env.wasm.wasmPaths` instead of bundling it: its worker threads import that file.
  resolve: { conditions: ["onnxruntime-web-use-extern-wasm", "module", "browser", "production"] },
  build: {
    target: "es2022",
    outDir: "../dist-bench",
    emptyOutDir: true,
    chunkSizeWarningLimit: 4096,
    rollupOptions: {
      input: {
        bench: fileURLToPath(new URL("./bench/bench.html", import.meta.url)),
        translation: fileURLToPath(new URL("./bench/translation.html", import.meta.url)),
      },
    },
  },
});
