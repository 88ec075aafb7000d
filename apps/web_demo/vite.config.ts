// The app (index.html) and the library module (dist/keras-attn-web.js) in one build, with
// LiteRT.js' wasm files copied from the npm package to dist/litert-wasm/ (served by our own
// origin: the page fetches nothing from elsewhere).
import { readdirSync, readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { defineConfig, type Plugin } from "vite";

const WASM_SOURCE = fileURLToPath(new URL("./node_modules/@litertjs/core/wasm/", import.meta.url));
// The single-threaded build, the threaded one (cross-origin isolated pages) and the one for
// browsers without relaxed SIMD; the JSPI build is not used.
const WASM_BUILDS = /^litert_wasm_(internal|threaded_internal|compat_internal)\.(js|wasm)$/;

function litertWasm(): Plugin {
  const files = () => readdirSync(WASM_SOURCE).filter((name) => WASM_BUILDS.test(name));
  return {
    name: "keras-attn-litert-wasm",
    configureServer(server) {
      server.middlewares.use("/litert-wasm/", (request, response, next) => {
        const name = (request.url ?? "").split("?")[0].replace(/^\//, "");
        if (!files().includes(name)) return next();
        response.setHeader("Content-Type", name.endsWith(".wasm") ? "application/wasm" : "text/javascript");
        response.end(readFileSync(WASM_SOURCE + name));
      });
    },
    generateBundle() {
      // The library's TypeScript types: `tsc -p tsconfig.lib.json` writes dist/types/.
      this.emitFile({ type: "asset", fileName: "keras-attn-web.d.ts", source: 'export * from "./types/index";\n' });
      for (const name of files()) {
        this.emitFile({ type: "asset", fileName: `litert-wasm/${name}`, source: readFileSync(WASM_SOURCE + name) });
      }
    },
  };
}

export default defineConfig({
  base: "./",
  plugins: [litertWasm()],
  build: {
    target: "es2022",
    outDir: "dist",
    emptyOutDir: true,
    chunkSizeWarningLimit: 2048,
    rollupOptions: {
      input: { index: "index.html", "keras-attn-web": "src/lib/index.ts" },
      preserveEntrySignatures: "allow-extension",
      output: {
        entryFileNames: (chunk) => (chunk.name === "keras-attn-web" ? "keras-attn-web.js" : "assets/[name]-[hash].js"),
      },
    },
  },
  server: {
    headers: {
      "Cross-Origin-Opener-Policy": "same-origin",
      "Cross-Origin-Embedder-Policy": "require-corp",
    },
  },
});
