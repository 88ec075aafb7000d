// The demo page: a Classify, an Entities, a Translate and a Generate tab on keras-attn's
// library (src/lib), models from the export directories `make web` serves (models/index.json)
// or from a file the user drops.
import "./style.css";

import {
  CARD_FILE, GenerationModel, hasWasmSimd, loadGenerator, loadModel, loadTranslator, readAssociatedFiles, TranslationModel,
} from "../lib/index";
import type { ClassificationResult, GenerateOptions, NerResult, Run, TextModel } from "../lib/index";
import {
  cardFields, decodingNote, describeError, entityColor, generationCardFields, generationNote, generationTiming,
  translationCardFields, translationTiming, truncationNotice, type ListedModel,
} from "./view";

type Task = "classification" | "ner" | "translation" | "generation";
type Loaded = TextModel | TranslationModel | GenerationModel;
const TASK_NAMES: Record<Task, string> = {
  classification: "Classify", ner: "Entities", translation: "Translate", generation: "Generate",
};
const KINDS: Record<Task, string> = {
  classification: "classification", ner: "named-entity", translation: "translation", generation: "language",
};
/** The card task of the exports that bring a tab of their own. */
const CARD_TASKS: Partial<Record<Task, string>> = { translation: "seq2seq", generation: "causal_lm" };
const EXAMPLES: Record<Task, string> = {
  classification: "The staff were friendly and the food arrived quickly.",
  ner: "Priya Nair met officials from Union Rail in Dublin on Friday.",
  translation: "Ein Mann fährt Fahrrad.", // Multi30k's German -> English (docs/export.md)
  generation: "ROMEO:", // the Shakespeare character model (docs/training.md)
};
const WASM_PATH = new URL("litert-wasm/", document.baseURI).href;

/** Thrown from a translation's onToken (a generation's onText) when a newer run replaced it: its decoding stops. */
class Superseded extends Error {}

const $ = <T extends HTMLElement>(id: string) => document.getElementById(id) as T;
const state = {
  task: "classification" as Task,
  models: { classification: null, ner: null, translation: null, generation: null } as Record<Task, Loaded | null>,
  texts: { ...EXAMPLES },
  /** Counts runs; a translation or generation whose number is no longer the last stops at its next token. */
  runs: 0,
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
    const index = (await response.json()) as {
      exports: { name: string; task?: string | null; default_file?: string | null; files: ListedModel[] }[];
    };
    return index.exports.flatMap((e) => e.files.filter((f) => f.name.endsWith(".tflite"))
      .map((f) => ({ ...f, exportName: e.name, exportTask: e.task ?? null, exportDefault: e.default_file ?? null })));
  } catch {
    return []; // a static host without models: the file picker still works
  }
}

/**
 * The listed file a tab starts with: the int8 file with length buckets of an export, else the
 * file its card recommends (a translation export's `default_file`), else its first.
 */
function defaultFile(listed: ListedModel[], index: number): ListedModel | undefined {
  const ofExport = listed.filter((f) => f.exportName === listed[index]?.exportName);
  return ofExport.find((f) => f.name === "model_int8_buckets.tflite")
    ?? ofExport.find((f) => f.name === listed[index]?.exportDefault) ?? ofExport[0];
}

/** The bytes of a listed file's URL or of a chosen / dropped file. */
async function fileBytes(source: string | File): Promise<Uint8Array> {
  if (typeof source !== "string") return new Uint8Array(await source.arrayBuffer());
  const response = await fetch(source);
  if (!response.ok) throw new Error(`fetching ${source} gave HTTP ${response.status}`);
  return new Uint8Array(await response.arrayBuffer());
}

/**
 * The task of a file's embedded card ("seq2seq" for a translation file, "causal_lm" for a
 * language model's). Null for anything unreadable: loadModel then says what is wrong with it.
 */
async function cardTask(bytes: Uint8Array, name: string): Promise<string | null> {
  try {
    const card = (await readAssociatedFiles(bytes, name)).get(CARD_FILE);
    return card === undefined ? null : JSON.parse(new TextDecoder().decode(card)).task ?? null;
  } catch {
    return null;
  }
}

/** A file loaded with the library's loader for its kind: a translator, a generator or a text model. */
async function loadFile(source: string | File, name: string): Promise<Loaded> {
  const bytes = await fileBytes(source);
  const options = { name, wasmPath: WASM_PATH, threads: state.threads, accelerator: state.accelerator };
  const task = await cardTask(bytes, name);
  if (task === CARD_TASKS.translation) return loadTranslator(bytes, options);
  if (task === CARD_TASKS.generation) return loadGenerator(bytes, options);
  return loadModel(bytes, options);
}

function taskOf(model: Loaded): Task {
  if (model instanceof TranslationModel) return "translation";
  if (model instanceof GenerationModel) return "generation";
  return model.task as Task;
}

/** Loads a model into the tab of its task; `preload`: quietly, at start-up. */
async function open(source: string | File, name: string, preload = false): Promise<void> {
  if (!preload) say(null); // a start-up load leaves what a person's action said in place
  setBusy(`loading ${name}…`);
  try {
    const model = await loadFile(source, name);
    const task = taskOf(model);
    if (task === "translation" || task === "generation") state.runs += 1; // a decoding on the old one stops
    state.models[task]?.delete();
    state.models[task] = model;
    if (model instanceof TranslationModel) setBeams(model.card.numBeams);
    if (model instanceof GenerationModel) setNewTokenLimit(model.positions);
    if (preload) {
      // The current tab answers as soon as its model is there, not after every model loaded.
      if (task === state.task) {
        render();
        await runText();
      }
      return;
    }
    if (task !== state.task) {
      say(`${name} is a ${KINDS[task]} model, not a ${KINDS[state.task]} one: it is now the model ` +
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

const ASK: Record<Task, string> = {
  classification: "Type a text to classify it.",
  ner: "Type a text to find its entities.",
  translation: "Type a sentence to translate it.",
  generation: "Type a prompt for the model to continue.",
};

async function runText(): Promise<void> {
  const model = state.models[state.task];
  const text = $<HTMLTextAreaElement>("text").value;
  const runNumber = (state.runs += 1);
  state.texts[state.task] = text;
  $("result").replaceChildren();
  $("notice").hidden = true;
  if (!model) return;
  if (text.trim() === "") {
    showNotice(ASK[state.task]);
    return;
  }
  if (model instanceof TranslationModel) return translateText(model, text, runNumber);
  if (model instanceof GenerationModel) return generateText(model, text, runNumber);
  try {
    const run = await model.run(text);
    showResult(model, run);
  } catch (error) {
    say(describeError(error, model.name));
  }
}

/** A new task: lets the browser paint a token before the next decoding step (LiteRT.js'
 * wasm calls never yield; timers would be throttled in a background tab, messages are not). */
function nextTask(): Promise<void> {
  return new Promise((resolve) => {
    const channel = new MessageChannel();
    channel.port1.onmessage = () => resolve();
    channel.port2.postMessage(null);
  });
}

/**
 * Translates `text`, showing the text as it is decoded (greedy: the tokens so far; beam
 * search: the best live beam), then the translation and its ms per sentence. The line's
 * `data-tokens` holds the shown token ids and `data-state` is "decoding" until "done" (for
 * scripts and the browser tests). A newer run (`state.runs`) stops it at its next token.
 */
async function translateText(model: TranslationModel, text: string, runNumber: number): Promise<void> {
  const beams = chosenBeams(model);
  const line = document.createElement("p");
  line.id = "translation";
  line.className = "translation";
  const note = document.createElement("p");
  note.id = "decoding";
  note.className = "muted";
  const show = (shown: string, tokens: ArrayLike<number>, phase: "decoding" | "done") => {
    line.textContent = shown;
    line.dataset.tokens = Array.from(tokens).join(" ");
    line.dataset.state = phase;
  };
  show("", [], "decoding");
  note.textContent = decodingNote(beams, null);
  $("result").replaceChildren(line, note);
  $("latency").textContent = "translating…";
  try {
    // Checked again after the pause: a new model may have replaced (and freed) this one.
    const current = () => {
      if (runNumber !== state.runs) throw new Superseded();
    };
    const translation = await model.translate(text, { beams, onToken: ({ text: partial, tokens }) => {
      current();
      show(partial, tokens, "decoding");
      return nextTask().then(current);
    } });
    if (runNumber !== state.runs) return;
    show(translation.text, translation.tokens, "done");
    note.textContent = decodingNote(beams, translation);
    $("latency").textContent = translationTiming(translation, state.threads);
  } catch (error) {
    if (!(error instanceof Superseded)) say(describeError(error, model.name));
  }
}

/**
 * Continues `prompt`, the text appearing piece by piece (a character model: character by
 * character) after the prompt, then the ms per token. `#generation`'s `data-tokens` holds the
 * new token ids shown and `data-state` is "decoding" until "done"; `#continuation` holds the
 * generated text alone (for scripts and the browser tests). A newer run stops it.
 */
async function generateText(model: GenerationModel, prompt: string, runNumber: number): Promise<void> {
  let options: GenerateOptions;
  try {
    options = generationOptions();
  } catch (error) {
    say(describeError(error, model.name));
    return;
  }
  const line = document.createElement("p");
  line.id = "generation";
  line.className = "generation";
  const shownPrompt = document.createElement("span");
  shownPrompt.className = "prompt";
  shownPrompt.textContent = prompt;
  const continuation = document.createElement("span");
  continuation.id = "continuation";
  line.append(shownPrompt, continuation);
  const note = document.createElement("p");
  note.id = "decoding";
  note.className = "muted";
  const show = (text: string, tokens: ArrayLike<number>, phase: "decoding" | "done") => {
    continuation.textContent = text;
    line.dataset.tokens = Array.from(tokens).join(" ");
    line.dataset.state = phase;
  };
  show("", [], "decoding");
  note.textContent = generationNote(options, null);
  $("result").replaceChildren(line, note);
  $("latency").textContent = "generating…";
  try {
    const current = () => {
      if (runNumber !== state.runs) throw new Superseded();
    };
    const started = performance.now();
    const generation = await model.generate(prompt, { ...options, onText: (_piece, progress) => {
      current();
      show(progress.text, progress.ids, "decoding");
      $("latency").textContent = `generating… ${progress.step} tokens, ${((performance.now() - started) / 1000).toFixed(1)} s`;
      return nextTask().then(current);
    } });
    if (runNumber !== state.runs) return;
    show(generation.text, generation.ids, "done");
    note.textContent = generationNote(options, generation);
    $("latency").textContent = generationTiming(generation, state.threads);
  } catch (error) {
    if (!(error instanceof Superseded)) say(describeError(error, model.name));
  }
}

/** The generation settings of the page's fields: new tokens (empty: all that fit), greedy or top-k with seed. */
function generationOptions(): GenerateOptions {
  const field = (id: string) => $<HTMLInputElement>(id).value.trim();
  const whole = (id: string, what: string, low: number): number | undefined => {
    const text = field(id);
    if (text === "") return undefined;
    const value = Number(text);
    if (!Number.isInteger(value) || value < low) throw new RangeError(`${what} must be a whole number from ${low}, got "${text}"`);
    return value;
  };
  const maxNewTokens = whole("max-new-tokens", "New tokens", 1);
  if ($<HTMLSelectElement>("sampler").value !== "sample") return { maxNewTokens };
  const temperature = Number(field("temperature") || "1");
  if (!(temperature > 0)) throw new RangeError(`Temperature must be a number above 0, got "${field("temperature")}"`);
  return { maxNewTokens, sampler: "sample", topK: whole("top-k", "Top-k", 1) ?? null, temperature,
    seed: whole("seed", "Seed", 0) ?? null };
}

/** The beams asked for in the page: a whole number from 1, else the card's. */
function chosenBeams(model: TranslationModel): number {
  const beams = Number($<HTMLInputElement>("beams").value);
  return Number.isInteger(beams) && beams >= 1 ? beams : model.card.numBeams;
}

/** The New tokens field's limit: the positions of the model less one (the shortest prompt). */
function setNewTokenLimit(positions: number): void {
  const input = $<HTMLInputElement>("max-new-tokens");
  input.max = String(positions - 1);
  input.placeholder = `all (≤ ${positions - 1})`;
}

function setBeams(beams: number): void {
  const input = $<HTMLInputElement>("beams");
  input.max = String(Math.max(8, beams));
  input.value = String(beams);
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
  // The Translate tab exists where a translation export is served or a translator loaded.
  $("tab-translation").hidden = !(state.models.translation || state.listed.some((f) => f.exportTask === "seq2seq"));
  // The Generate tab, where a language model export is served or a generator loaded.
  $("tab-generation").hidden = !(state.models.generation || state.listed.some((f) => f.exportTask === "causal_lm"));
  $("translate-options").hidden = state.task !== "translation";
  $("generate-options").hidden = state.task !== "generation";
  $("sampling-options").hidden = $<HTMLSelectElement>("sampler").value !== "sample";
  $("text-label").textContent = state.task === "translation" ? "Source sentence" : state.task === "generation" ? "Prompt" : "Text";
  const select = $<HTMLSelectElement>("model-select");
  select.replaceChildren(new Option(model ? model.name : "(no model: drop a .tflite file)", ""));
  for (const [i, f] of state.listed.entries()) {
    select.append(new Option(`${f.exportName} / ${f.name} (${(f.bytes / 1e6).toFixed(1)} MB)`, String(i)));
  }
  select.value = "";
  const fields = model instanceof TranslationModel ? translationCardFields(model)
    : model instanceof GenerationModel ? generationCardFields(model) : model ? cardFields(model) : [];
  $("card-fields").replaceChildren(...fields);
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
  // The first tab with a model, when the first tab has none.
  const loaded = (Object.keys(TASK_NAMES) as Task[]).find((task) => state.models[task] !== null);
  selectTab(state.models[state.task] === null && loaded ? loaded : state.task);
}

function bindEvents(): void {
  for (const tab of document.querySelectorAll<HTMLButtonElement>("[role=tab]")) {
    tab.addEventListener("click", () => selectTab(tab.dataset.task as Task));
  }
  $("run").addEventListener("click", () => void runText());
  $("beams").addEventListener("change", () => void runText());
  $("sampler").addEventListener("change", () => {
    $("sampling-options").hidden = $<HTMLSelectElement>("sampler").value !== "sample";
  });
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
