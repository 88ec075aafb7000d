// tools/serve.mjs: the static server of `make web` (dist/ and export directories, one origin,
// cross-origin isolated, nothing outside its folders).
import { mkdirSync, mkdtempSync, writeFileSync } from "node:fs";
import { createServer, type Server } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { afterAll, beforeAll, describe, expect, it } from "vitest";

// @ts-expect-error: a plain ES module without types
import { exportName, handler, modelFiles, modelIndex, parseArguments } from "../tools/serve.mjs";

const root = mkdtempSync(join(tmpdir(), "serve-"));
const dist = join(root, "dist");
const exported = join(root, "sentiment", "export");
let server: Server;
let base = "";

beforeAll(async () => {
  mkdirSync(join(dist, "litert-wasm"), { recursive: true });
  mkdirSync(exported, { recursive: true });
  writeFileSync(join(dist, "index.html"), "<!doctype html>page");
  writeFileSync(join(dist, "litert-wasm", "x.wasm"), new Uint8Array([0, 97, 115, 109]));
  writeFileSync(join(exported, "model_int8.tflite"), "TFL3");
  writeFileSync(join(exported, "model_text.tflite"), "TFL3");
  writeFileSync(join(exported, "model.onnx"), "onnx");
  writeFileSync(join(exported, "model_card.json"), "{}");
  writeFileSync(join(root, "secret.txt"), "secret");
  server = createServer(handler({ dist, exports: [exported] }));
  await new Promise<void>((done) => server.listen(0, "127.0.0.1", done));
  base = `http://127.0.0.1:${(server.address() as { port: number }).port}`;
});
afterAll(() => server.close());

describe("serve.mjs", () => {
  it("serves dist/ with the isolation headers and the wasm MIME type", async () => {
    const page = await fetch(`${base}/`);
    expect(await page.text()).toBe("<!doctype html>page");
    expect(page.headers.get("cross-origin-opener-policy")).toBe("same-origin");
    expect(page.headers.get("cross-origin-embedder-policy")).toBe("require-corp");
    expect((await fetch(`${base}/litert-wasm/x.wasm`)).headers.get("content-type")).toBe("application/wasm");
  });

  it("lists the models LiteRT.js and onnxruntime can run, and serves them", async () => {
    const index = await (await fetch(`${base}/models/index.json`)).json();
    expect(index).toEqual(modelIndex([exported]));
    expect(index.exports[0].name).toBe("sentiment");
    expect(index.exports[0].files.map((f: { name: string }) => f.name)).toEqual(["model.onnx", "model_int8.tflite"]);
    expect(await (await fetch(`${base}/models/0/model_int8.tflite`)).text()).toBe("TFL3");
    expect((await fetch(`${base}/models/1/model_int8.tflite`)).status).toBe(404);
  });

  it("lists the files of the card's artifact list, in its order, and MediaPipe's of the report", () => {
    const listed = join(root, "listed");
    mkdirSync(listed);
    for (const name of ["model_fp32.tflite", "model_int8.tflite", "model_text.tflite", "model.onnx",
      "model_int8_mediapipe.tflite", "stray.tflite"]) writeFileSync(join(listed, name), "x");
    writeFileSync(join(listed, "model_card.json"), JSON.stringify({ artifacts: [
      { file: "model_int8.tflite", kind: "tflite", precision: "int8", lengths: [128] },
      { file: "model_fp32.tflite", kind: "tflite", precision: "fp32", lengths: [128] },
      { file: "model_fp16.tflite", kind: "tflite", precision: "fp16", lengths: [128] },
      { file: "saved_model", kind: "saved_model", precision: "fp32", lengths: [] },
      { file: "model_text.tflite", kind: "text_tflite", precision: "fp32", lengths: [128] },
      { file: "model.onnx", kind: "onnx", precision: "fp32", lengths: [] },
    ] }));
    writeFileSync(join(listed, "export_report.json"), JSON.stringify({
      self_describing_tflite: { mediapipe: { "model_int8_mediapipe.tflite": {} } } }));
    // Listed and present only (model_fp16 was not written), never a file the card does not name.
    expect(modelFiles(listed)).toEqual([
      { name: "model_int8.tflite", precision: "int8" }, { name: "model_fp32.tflite", precision: "fp32" },
      { name: "model.onnx", precision: "fp32" }, { name: "model_int8_mediapipe.tflite", precision: "int8" }]);
    writeFileSync(join(listed, "model_card.json"), "{\"artifacts\": [");
    expect(() => modelFiles(listed)).toThrow("model_card.json is damaged");
  });

  it("refuses paths outside its folders and methods other than GET", async () => {
    for (const path of ["/../secret.txt", "/%2e%2e/secret.txt", "/models/0/..%2fsecret.txt", "/models/0/%2e%2e%2f..%2fsecret.txt"]) {
      const response = await fetch(`${base}${path}`);
      expect(response.status, path).toBe(404);
    }
    expect((await fetch(`${base}/`, { method: "POST" })).status).toBe(405);
  });

  it("parses its arguments and says what is wrong", () => {
    expect(parseArguments(["--export", "a,b", "--export", "c", "--port", "9000"])).toMatchObject({ exports: ["a", "b", "c"], port: 9000 });
    expect(() => parseArguments(["--port", "x"])).toThrow("--port must be an integer");
    expect(() => parseArguments(["--nope", "1"])).toThrow("unknown argument --nope");
    expect(() => parseArguments(["--export"])).toThrow("--export needs a value");
    expect(exportName("runs/demo/entities/export")).toBe("entities");
    expect(exportName("exports/mine")).toBe("mine");
  });
});
