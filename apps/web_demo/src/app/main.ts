// The demo page: a Classify and an Entities tab on keras-attn's library (src/lib), models from
// the export directories `make web` serves (models/index.json) or from a file the user drops.
import "./style.css";

import { hasWasmSimd, loadModel, type Run, type TextModel } from "../lib/index";
import type { ClassificationResult, NerResult } from "../lib/index";
import { cardFields, describeError, entityColor, truncationNotice, type ListedModel } from "./view";

type Task = "classification" | "ner";
const TASK_NAMES: Record<Task, string> = { classification: "Classify", ner: "Entities" };
const EXAMPLES: Record<Task, string> = {
  classification: "The staff were friendly and the food arrived quickly.",
  ner: "Priya Nair met officials from Union Rail in Dublin on Friday.",
};
const WASM_PATH = new URL("litert-wasm/", document.baseURI).href;

const $ = <T extends HTMLElement>(id: string) => document.getElementById(id) as T;
const state = {
  task: "classification" as Task,
  models: { classification: null, ner: null } as Record<Task, TextModel | null>,
  texts: { ...EXAMPLES },
  listed: [] as ListedModel[],
  threads: Number(new URLSearchParams(location.search).get("threads") ?? "1"),
  // `?accelerator=webgpu`: LiteRT.js' WebGPU accelerator where the browser has it.
  accelerator: (new URLSearchParams(location.search).get("accelerator") === "webgpu" ? "webgpu" : "wasm") as "wasm" | "webgpu",
  // `?preload=0`: list the served models but load none (scripts that drive the library).
  preload: new URLSearchParams(location.search).get("preload") !== "0",
};

/** Shows a message (an error unless `kind` says otherwise); `null` hides it. */
function say(message: string | null, kind: "error" | "info" = "error"): void {
  const box = $("message");
  box.hidden = message === null;
  box.className = kind;
  box.textContent = message ?? "";
}

async function listModels(): Promise<ListedModel[]> {
  try {
    const response = await fetch("models/index.json");
    if (!response.ok) return [];
    const index = (await response.json()) as { exports: { name: string; files: ListedModel[] }[] };
    return index.exports.flatMap((e) => e.files.filter((f) => f.name.endsWith(".tflite"))
      .map((f) => ({ ...f, exportName: e.name })));
  } catch {
    return []; // a static host without models: the file picker still works
  }
}

/** The listed file a tab starts with: the int8 file with length buckets of an export. */
function defaultFile(listed: ListedModel[], index: number): ListedModel | undefined {
  const ofExport = listed.filter((f) => f.exportName === listed[index]?.exportName);
  return ofExport.find((f) => f.name === "model_int8_buckets.tflite") ?? ofExport[0];
}

/** Loads a model into the tab of its task; `preload`: quietly, at start-up. */
async function open(source: string | File, name: string, preload = false): Promise<void> {
  say(null);
  setBusy(`loading ${name}…`);
  try {
    const model = await loadModel(source, { name, wasmPath: WASM_PATH, threads: state.threads,
      accelerator: state.accelerator });
    const task = model.task as Task;
    state.models[task]?.delete();
    state.models[task] = model;
    if (preload) {
      // The current tab answers as soon as its model is there, not after every model loaded.
      if (task === state.task) {
        render();
        await runText();
      }
      return;
    }
    if (task !== state.task) {
      say(`${name} is a ${model.task === "ner" ? "named-entity" : "classification"} model, not ` +
        `a ${state.task === "ner" ? "named-entity" : "classification"} one: it is now the model ` +
        `of the ${TASK_NAMES[task]} tab`, "info");
      selectTab(task);
    } else {
      render();
    }
    await runText();
  } catch (error) {
    say(describeError(error, name));
  } finally {
    setBusy(null);
  }
}

function setBusy(text: string | null): void {
  $<HTMLButtonElement>("run").disabled = text !== null;
  if (text) $("latency").textContent = text;
}

async function runText(): Promise<void> {
  const model = state.models[state.task];
  const text = $<HTMLTextAreaElement>("text").value;
  state.texts[state.task] = text;
  $("result").replaceChildren();
  $("notice").hidden = true;
  if (!model) return;
  if (text.trim() === "") {
    showNotice(`Type a text to ${state.task === "ner" ? "find its entities" : "classify it"}.`);
    return;
  }
  try {
    const run = await model.run(text);
    showResult(model, run);
  } catch (error) {
    say(describeError(error, model.name));
  }
}

function showNotice(text: string | null): void {
  $("notice").hidden = text === null;
  $("notice").textContent = text ?? "";
}

function showResult(model: TextModel, run: Run): void {
  showNotice(truncationNotice(model, run));
  const result = $("result");
  if (model.task === "ner") result.replaceChildren(...entityView(run.result as NerResult, $<HTMLTextAreaElement>("text").value));
  else result.replaceChildren(...classView(run.result as ClassificationResult));
  const t = run.timing;
  $("latency").textContent = `${(t.tokenizeMs + t.modelMs + t.decodeMs).toFixed(1)} ms: ` +
    `tokenize ${t.tokenizeMs.toFixed(1)}, model ${t.modelMs.toFixed(1)} (signature ` +
    `${run.bucket.signature}, ${run.numTokens} of ${run.bucket.length} tokens), decode ` +
    `${t.decodeMs.toFixed(1)} · ${state.threads} thread${state.threads > 1 ? "s" : ""}`;
}

function classView(result: ClassificationResult): HTMLElement[] {
  const label = document.createElement("p");
  label.className = "label";
  label.dataset.label = result.label;
  label.textContent = result.label;
  const bars = Object.entries(result.probabilities).sort((a, b) => b[1] - a[1]).map(([name, p]) => {
    const row = document.createElement("div");
    row.className = "bar";
    row.innerHTML = `<span class="name"></span><span class="track"><span class="fill"></span></span><span class="value"></span>`;
    (row.querySelector(".name") as HTMLElement).textContent = name;
    (row.querySelector(".fill") as HTMLElement).style.width = `${(100 * p).toFixed(1)}%`;
    (row.querySelector(".value") as HTMLElement).textContent = p.toFixed(3);
    return row;
  });
  return [label, ...bars];
}

function entityView(result: NerResult, text: string): HTMLElement[] {
  const points = Array.from(text); // entity offsets count code points
  const marked = document.createElement("p");
  marked.className = "entities";
  let at = 0;
  for (const entity of result.entities) {
    marked.append(points.slice(at, entity.start).join(""));
    const mark = document.createElement("mark");
    mark.dataset.type = entity.type;
    mark.style.background = entityColor(entity.type);
    mark.textContent = points.slice(entity.start, entity.end).join("");
    const tag = document.createElement("sub");
    tag.textContent = entity.type;
    mark.append(tag);
    marked.append(mark);
    at = entity.end;
  }
  marked.append(points.slice(at).join(""));
  const summary = document.createElement("p");
  summary.className = "muted";
  summary.textContent = result.entities.length ? `${result.entities.length} entities in ${result.words.length} words` : "no entities";
  return [marked, summary];
}

function selectTab(task: Task): void {
  state.texts[state.task] = $<HTMLTextAreaElement>("text").value;
  state.task = task;
  for (const tab of document.querySelectorAll<HTMLButtonElement>("[role=tab]")) {
    tab.setAttribute("aria-selected", String(tab.dataset.task === task));
  }
  $<HTMLTextAreaElement>("text").value = state.texts[task];
  render();
  void runText();
}

function render(): void {
  const model = state.models[state.task];
  const select = $<HTMLSelectElement>("model-select");
  select.replaceChildren(new Option(model ? model.name : "(no model: drop a .tflite file)", ""));
  for (const [i, f] of state.listed.entries()) {
    select.append(new Option(`${f.exportName} / ${f.name} (${(f.bytes / 1e6).toFixed(1)} MB)`, String(i)));
  }
  select.value = "";
  $("card-fields").replaceChildren(...(model ? cardFields(model) : []));
}

async function start(): Promise<void> {
  $("runtime").textContent = hasWasmSimd()
    ? `LiteRT.js on WebAssembly (${state.accelerator} accelerator, ${state.threads} thread${state.threads > 1 ? "s" : ""}${crossOriginIsolated ? ", cross-origin isolated" : ""})`
    : "This browser has no WebAssembly SIMD: the models cannot run here.";
  state.listed = await listModels();
  $<HTMLTextAreaElement>("text").value = state.texts[state.task];
  render();
  bindEvents();
  if (!hasWasmSimd()) {
    say("This browser has no WebAssembly SIMD, which LiteRT.js needs: use a current Chrome, Edge, Firefox or Safari (16.4 or later).");
    return;
  }
  const seen = new Set<string>();
  for (const [i, f] of state.preload ? state.listed.entries() : []) {
    if (seen.has(f.exportName)) continue;
    seen.add(f.exportName);
    const file = defaultFile(state.listed, i);
    if (file) await open(file.url, `${file.exportName}/${file.name}`, true);
  }
  if (state.models.classification === null && state.models.ner !== null) selectTab("ner");
  else selectTab(state.task);
}

function bindEvents(): void {
  for (const tab of document.querySelectorAll<HTMLButtonElement>("[role=tab]")) {
    tab.addEventListener("click", () => selectTab(tab.dataset.task as Task));
  }
  $("run").addEventListener("click", () => void runText());
  $("text").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) {
      event.preventDefault();
      void runText();
    }
  });
  $<HTMLSelectElement>("model-select").addEventListener("change", (event) => {
    const value = (event.target as HTMLSelectElement).value;
    const file = state.listed[Number(value)];
    if (value !== "" && file) void open(file.url, `${file.exportName}/${file.name}`);
  });
  $<HTMLInputElement>("file-input").addEventListener("change", (event) => {
    const file = (event.target as HTMLInputElement).files?.[0];
    if (file) void open(file, file.name);
  });
  const drop = $("drop");
  drop.addEventListener("dragover", (event) => { event.preventDefault(); drop.classList.add("over"); });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (event) => {
    event.preventDefault();
    drop.classList.remove("over");
    const file = event.dataTransfer?.files[0];
    if (file) void open(file, file.name);
  });
}

window.addEventListener("unhandledrejection", (event) => say(describeError(event.reason, "the page")));
void start();
