#!/usr/bin/env node
// Serves the built web app (dist/) and the models of export directories, from one origin.
//
//   node tools/serve.mjs [--export DIR[,DIR...]] [--port 8080] [--host 0.0.0.0] [--dist dist]
//
// - `/` is dist/ (run `npm run build` first);
// - `/models/index.json` lists each export's files: `{"exports": [{"name", "task",
//   "default_file", "files": [{"name", "url", "bytes", "precision"}]}]}`: the `tflite` and
//   `onnx` artifacts of its model_card.json (in the export's order; a translation card lists
//   bare file names, as a language model card does) and the MediaPipe files its
//   export_report.json lists; for an export made before the card listed its artifacts, the
//   .tflite and .onnx files found. `task` and `default_file` are the card's (`"seq2seq"` for a
//   translation export, `"causal_lm"` for a language model's; null when absent);
// - `/models/<i>/<file>` is a file of the i-th export directory.
// Every response carries Cross-Origin-Opener-Policy / Cross-Origin-Embedder-Policy, so the
// page is cross-origin isolated and LiteRT.js may use its threaded build. Nothing else is read:
// paths outside dist/ and the export directories are refused.
import { createReadStream, existsSync, readFileSync, readdirSync, statSync } from "node:fs";
import { createServer } from "node:http";
import { networkInterfaces } from "node:os";
import { basename, dirname, extname, join, resolve, sep } from "node:path";
import { fileURLToPath } from "node:url";

const HERE = dirname(fileURLToPath(import.meta.url));
const TYPES = {
  ".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
  ".mjs": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
  ".json": "application/json; charset=utf-8", ".wasm": "application/wasm",
  ".png": "image/png", ".svg": "image/svg+xml", ".ico": "image/x-icon",
  ".txt": "text/plain; charset=utf-8", ".map": "application/json",
};
const ISOLATION = {
  "Cross-Origin-Opener-Policy": "same-origin",
  "Cross-Origin-Embedder-Policy": "require-corp",
  "Cross-Origin-Resource-Policy": "same-origin",
};
// model_text.tflite needs tf-text's custom ops, which LiteRT.js does not have.
const SKIPPED = new Set(["model_text.tflite"]);

export function parseArguments(argv) {
  const options = { exports: [], port: 8080, host: "0.0.0.0", dist: join(HERE, "..", "dist") };
  for (let i = 0; i < argv.length; i += 1) {
    const [flag, value] = [argv[i], argv[i + 1]];
    if (value === undefined) throw new Error(`${flag} needs a value (see the usage at the top of serve.mjs)`);
    if (flag === "--export") options.exports.push(...value.split(",").filter(Boolean));
    else if (flag === "--port") options.port = Number(value);
    else if (flag === "--host") options.host = value;
    else if (flag === "--dist") options.dist = value;
    else throw new Error(`unknown argument ${flag}: use --export, --port, --host or --dist`);
    i += 1;
  }
  if (!Number.isInteger(options.port) || options.port < 0 || options.port > 65535) {
    throw new Error(`--port must be an integer in [0, 65535], got ${options.port}`);
  }
  return options;
}

/** The name shown for an export directory: `runs/demo/sentiment/export` -> `sentiment`. */
export function exportName(directory) {
  const path = resolve(directory);
  return basename(path) === "export" ? basename(dirname(path)) : basename(path);
}

function readJson(path) {
  if (!existsSync(path)) return null;
  try {
    return JSON.parse(readFileSync(path, "utf8"));
  } catch (error) {
    throw new Error(`${path} is damaged (${error.message}): re-run keras-attn export`);
  }
}

/** The precision a file's name says: `translation_dynamic_int8.tflite` -> `dynamic_int8`. */
export function namedPrecision(name) {
  return /dynamic_int8/.test(name) ? "dynamic_int8" : /int8/.test(name) ? "int8" : /fp16/.test(name) ? "fp16" : "fp32";
}

/**
 * A card's artifact entry as `{file, kind, precision}`: a classifier's or tagger's card lists
 * objects, a translation or language model card (`keras-attn export` of a seq2seq or
 * causal_lm run) bare file names.
 */
function artifactEntry(artifact) {
  if (typeof artifact !== "string") return artifact;
  return { file: artifact, kind: extname(artifact).slice(1), precision: namedPrecision(artifact) };
}

/** The model files of an export: `[{name, precision}]` from its card, else those found. */
export function modelFiles(directory) {
  const card = readJson(join(directory, "model_card.json"));
  if (!Array.isArray(card?.artifacts)) {
    return readdirSync(directory)
      .filter((name) => /\.(tflite|onnx)$/.test(name) && !SKIPPED.has(name))
      .sort()
      .map((name) => ({ name, precision: null }));
  }
  const listed = card.artifacts
    .map(artifactEntry)
    .filter((a) => (a.kind === "tflite" || a.kind === "onnx") && !SKIPPED.has(a.file))
    .map((a) => ({ name: a.file, precision: a.precision }));
  const report = readJson(join(directory, "export_report.json"));
  const mediapipe = Object.keys(report?.self_describing_tflite?.mediapipe ?? {})
    .map((name) => ({ name, precision: /int8/.test(name) ? "int8" : "fp32" }));
  return [...listed, ...mediapipe].filter((f) => existsSync(join(directory, f.name)));
}

/** What the page needs of a card before loading a file: which tab, which file first. */
function cardTask(directory) {
  const card = readJson(join(directory, "model_card.json"));
  return { task: card?.task ?? null, default_file: card?.default_file ?? null };
}

/** `/models/index.json` of the export directories. */
export function modelIndex(directories) {
  return {
    exports: directories.map((directory, i) => ({
      name: exportName(directory),
      ...cardTask(directory),
      files: modelFiles(directory).map(({ name, precision }) => ({
        name, url: `models/${i}/${name}`, bytes: statSync(join(directory, name)).size, precision,
      })),
    })),
  };
}

function inside(root, path) {
  const full = resolve(root, "." + sep + path);
  return full === resolve(root) || full.startsWith(resolve(root) + sep) ? full : null;
}

function send(response, status, body, type = "text/plain; charset=utf-8") {
  response.writeHead(status, { ...ISOLATION, "Content-Type": type, "Cache-Control": "no-cache" });
  response.end(body);
}

function sendFile(response, path, request) {
  if (!path || !existsSync(path) || !statSync(path).isFile()) return send(response, 404, "not found\n");
  const headers = { ...ISOLATION, "Cache-Control": "no-cache", "Content-Length": statSync(path).size,
    "Content-Type": TYPES[extname(path)] ?? "application/octet-stream" };
  response.writeHead(200, headers);
  if (request.method === "HEAD") return response.end();
  createReadStream(path).pipe(response);
}

export function handler(options) {
  const directories = options.exports.map((d) => resolve(d));
  return (request, response) => {
    if (request.method !== "GET" && request.method !== "HEAD") return send(response, 405, "GET only\n");
    let path;
    try {
      path = decodeURIComponent(new URL(request.url, "http://localhost").pathname);
    } catch {
      return send(response, 400, "bad path\n");
    }
    if (path === "/models/index.json") {
      return send(response, 200, JSON.stringify(modelIndex(directories)), TYPES[".json"]);
    }
    const model = /^\/models\/(\d+)\/([^/]+)$/.exec(path);
    if (model) {
      const directory = directories[Number(model[1])];
      return sendFile(response, directory && inside(directory, model[2]), request);
    }
    return sendFile(response, inside(options.dist, path.endsWith("/") ? path + "index.html" : path), request);
  };
}

function addresses(port) {
  const lines = [`http://localhost:${port}/`];
  for (const entries of Object.values(networkInterfaces())) {
    for (const entry of entries ?? []) {
      if (entry.family === "IPv4" && !entry.internal) lines.push(`http://${entry.address}:${port}/`);
    }
  }
  return lines;
}

function main() {
  const options = parseArguments(process.argv.slice(2));
  if (!existsSync(join(options.dist, "index.html"))) {
    throw new Error(`${options.dist}/index.html is missing: run \`npm run build\` in apps/web_demo (or \`make web\`)`);
  }
  for (const directory of options.exports) {
    if (!existsSync(directory) || !statSync(directory).isDirectory()) {
      throw new Error(`--export ${directory}: no such directory (run \`make demo\`, or pass an export directory of \`keras-attn export\`)`);
    }
  }
  const server = createServer(handler(options));
  server.listen(options.port, options.host, () => {
    const { port } = server.address();
    const names = options.exports.map(exportName).join(", ") || "none (load a .tflite file in the page)";
    console.log(`keras-attn web demo, models: ${names}`);
    for (const line of addresses(port)) console.log(`  ${line}`);
  });
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  try {
    main();
  } catch (error) {
    console.error(`serve.mjs: error: ${error.message}`);
    process.exit(2);
  }
}
