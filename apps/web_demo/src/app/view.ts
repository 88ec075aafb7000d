// What the page shows about a model and its runs: the card, error and truncation messages,
// entity colours, a translation's timing. No state; main.ts puts them in the document.
import { GenerationError, ModelAssetError, RuntimeError, type Run, type TextModel } from "../lib/index";
import type { GenerateOptions, Generation, GenerationModel, Translation, TranslationModel } from "../lib/index";

/** A file of `models/index.json` (`tools/serve.mjs`), with the export it belongs to. */
export interface ListedModel {
  name: string;
  url: string;
  bytes: number;
  exportName: string;
  /** The export card's task (`"seq2seq"`: a translation export, `"causal_lm"`: a language model's), null when not served. */
  exportTask: string | null;
  /** The file the export's card recommends (a translation or language model card's `default_file`), or null. */
  exportDefault: string | null;
}

const VARIANTS: Record<string, string> = {
  fp32: "float32",
  fp16: "float16 weights",
  dynamic_int8: "int8 weights, activations quantized at run time (dynamic range)",
  int8: "int8 (calibrated ranges; see the recipe)",
  int8_ptq: "int8, post-training quantization",
};
const PALETTE = ["#ffd166", "#8ecae6", "#b5e48c", "#f4a3c4", "#cdb4db", "#ffb703", "#90e0ef", "#e9c46a"];

/** `model_int8_buckets.tflite` -> `{variant: "int8", buckets: true}`; `translation_fp32.tflite`, `generation_fp32.tflite` -> fp32. */
export function fileVariant(name: string): { variant: string; buckets: boolean } {
  const stem = name.replace(/^.*\//, "").replace(/\.tflite$/, "");
  const buckets = stem.endsWith("_buckets");
  return { variant: stem.replace(/^(model|translation|generation)_/, "").replace(/_buckets$/, ""), buckets };
}

/** The card's `<dt>`/`<dd>` pairs: task, labels, lengths, precision and the int8 recipe. */
export function cardFields(model: TextModel): HTMLElement[] {
  const card = model.card;
  const { variant } = fileVariant(model.name);
  const raw = card.raw as Record<string, unknown>;
  const quantization = raw.quantization as { description?: string } | null | undefined;
  const rows: [string, string][] = [
    ["file", model.name],
    ["task", card.task === "ner" ? `named entities${card.crf ? " (CRF)" : ""}` : "text classification"],
    ["labels", card.labels.join(", ")],
    ["lengths", model.buckets.buckets.map((b) => b.length).join(", ") + " tokens" +
      (model.buckets.buckets.length > 1 ? " (one signature each; the shortest that holds the text runs)" : "")],
    ["tokenizer", `WordPiece, ${card.vocabularySize.toLocaleString("en")} pieces, ${card.lowercase ? "uncased" : "cased"}`],
    ["precision", VARIANTS[variant] ?? variant],
  ];
  if (variant.startsWith("int8")) {
    rows.push(["int8 recipe", quantization?.description ?? "not recorded in this file (exported before keras-attn wrote it into the card)"]);
  }
  const metric = (raw.metrics as Record<string, number | null> | undefined)?.[model.name.replace(/^.*\//, "")];
  if (typeof metric === "number") rows.push([`dev ${raw.metric ?? "metric"} (Python)`, metric.toFixed(4)]);
  return definitionList(rows);
}

/** The card's `<dt>`/`<dd>` pairs of a translation file: lengths, decoding, precision. */
export function translationCardFields(model: TranslationModel): HTMLElement[] {
  const card = model.card;
  const { variant } = fileVariant(model.name);
  const recommended = card.raw["default_file"];
  const rows: [string, string][] = [
    ["file", model.name],
    ["task", "translation (sequence to sequence)"],
    ["source lengths", card.sourceLengths.join(", ") + ` tokens (at most ${card.maxLength}; the shortest that holds the source runs)`],
    ["target length", `${card.targetMaxLength} tokens at most`],
    ["decoding", `beam search, ${card.numBeams} beam${card.numBeams > 1 ? "s" : ""}, length penalty ${card.lengthPenalty} (the card's; one decode_step call per beam and token)`],
    ["tokenizer", `joined WordPiece, ${model.assets.vocabulary.length.toLocaleString("en")} pieces, ${card.lowercase ? "uncased" : "cased"}`],
    ["precision", VARIANTS[variant] ?? variant],
  ];
  if (typeof recommended === "string") rows.push(["export's choice", recommended]);
  return definitionList(rows);
}

const TOKENIZERS: Record<string, string> = {
  characters: "characters", bytes: "UTF-8 bytes", wordpiece: "WordPiece",
};

/** The card's `<dt>`/`<dd>` pairs of a language model file: positions, tokenizer, precision. */
export function generationCardFields(model: GenerationModel): HTMLElement[] {
  const card = model.card;
  const { variant } = fileVariant(model.name);
  const recommended = card.raw["default_file"];
  const rows: [string, string][] = [
    ["file", model.name],
    ["task", "text generation (causal language model)"],
    ["positions", `${model.positions} tokens: prompt and continuation (one decode_step call per token)`],
    ["tokenizer", `${TOKENIZERS[card.tokenizer] ?? card.tokenizer}, ${card.vocabularySize.toLocaleString("en")} symbols` +
      (card.tokenizer === "wordpiece" ? (card.lowercase ? ", uncased" : ", cased") : "")],
    ["precision", variant === "int8" ? "int8 (the int8 recipe's layout, float residual stream; calibrated on training text)" : VARIANTS[variant] ?? variant],
  ];
  if (typeof recommended === "string") rows.push(["export's choice", recommended]);
  return definitionList(rows);
}

/** How a generation is decoded, under its text: greedy, or top-k sampling and its seed. */
export function generationNote(options: GenerateOptions, generation: Generation | null): string {
  const how = options.sampler === "sample"
    ? `sampling${options.topK ? `, top-${options.topK}` : ""}${options.temperature !== undefined && options.temperature !== 1 ? `, temperature ${options.temperature}` : ""}` +
      `, seed ${generation ? generation.seed : options.seed ?? "random"}`
    : "greedy decoding";
  if (generation === null) return `${how}: the text so far`;
  const tokens = `${generation.ids.length} new token${generation.ids.length === 1 ? "" : "s"}`;
  return `${how}, ${tokens}${generation.stopped ? " (the model ended the text)" : ""}`;
}

/** The latency line of a generation: ms per token and where the time went. */
export function generationTiming(generation: Generation, threads: number): string {
  const t = generation.timing;
  return `${t.msPerToken.toFixed(2)} ms per token: ${generation.ids.length} new tokens in ${t.generateMs.toFixed(1)} ms, ` +
    `the prompt's ${generation.promptIds.length} in ${t.promptMs.toFixed(1)} ms (${generation.modelCalls} decode_step calls) · ` +
    `${threads} thread${threads > 1 ? "s" : ""}`;
}

/** `[term, value]` rows as `<dt>`/`<dd>` pairs; each `<dd>` carries its term as `data-field`. */
function definitionList(rows: [string, string][]): HTMLElement[] {
  return rows.flatMap(([term, value]) => {
    const dt = document.createElement("dt");
    dt.textContent = term;
    const dd = document.createElement("dd");
    dd.textContent = value;
    dd.dataset.field = term;
    return [dt, dd];
  });
}

/** How a translation was decoded, under its text: greedy, or the beams and the final score. */
export function decodingNote(beams: number, translation: Translation | null): string {
  const how = beams === 1 ? "greedy decoding" : `beam search, ${beams} beams`;
  if (translation === null) {
    return beams === 1 ? `${how}: the tokens so far` : `${how}: the best live beam so far (the translation may end on another beam)`;
  }
  const tokens = `${translation.tokens.length} token${translation.tokens.length === 1 ? "" : "s"}`;
  return beams === 1 ? `${how}, ${tokens}` : `${how}, ${tokens}, score ${translation.score.toFixed(3)} (sum of log p / length^penalty)`;
}

/** The latency line of a translation: ms per sentence and where it went. */
export function translationTiming(translation: Translation, threads: number): string {
  const t = translation.timing;
  return `${(t.encodeMs + t.decodeMs).toFixed(1)} ms per sentence: encode ${t.encodeMs.toFixed(1)} ` +
    `(source length ${translation.sourceLength}, ${translation.sourceIds.length} tokens), decode ` +
    `${t.decodeMs.toFixed(1)} (${translation.modelCalls} decode_step calls) · ${threads} thread${threads > 1 ? "s" : ""}`;
}

/** The message for an error of loading or running `name`. */
export function describeError(error: unknown, name: string): string {
  if (error instanceof ModelAssetError || error instanceof RuntimeError || error instanceof GenerationError) return error.message;
  const message = error instanceof Error ? error.message : String(error);
  return `${name}: ${message}`;
}

/** What the page says when the text did not fit the model's longest length, else null. */
export function truncationNotice(model: TextModel, run: Run): string | null {
  if (run.numTruncated === 0) return null;
  const length = model.buckets.sequenceLength;
  return model.task === "ner"
    ? `The text is longer than the model's ${length} tokens: its last ${run.numTruncated} ` +
      `word${run.numTruncated > 1 ? "s were" : " was"} cut and tagged O, as keras-attn predict does.`
    : `The text is longer than the model's ${length} tokens: ${run.numTruncated} word ` +
      `piece${run.numTruncated > 1 ? "s were" : " was"} cut from its end, as keras-attn predict does.`;
}

/** A stable colour per entity type. */
export function entityColor(type: string): string {
  let hash = 0;
  for (const c of type) hash = (hash * 31 + c.codePointAt(0)!) >>> 0;
  return PALETTE[hash % PALETTE.length];
}
