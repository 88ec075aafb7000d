// What the page shows about a model and its runs: the card, error and truncation messages,
// entity colours. No state; main.ts puts them in the document.
import { ModelAssetError, RuntimeError, type Run, type TextModel } from "../lib/index";

/** A file of `models/index.json` (`tools/serve.mjs`), with the export it belongs to. */
export interface ListedModel {
  name: string;
  url: string;
  bytes: number;
  exportName: string;
}

const VARIANTS: Record<string, string> = {
  fp32: "float32",
  fp16: "float16 weights",
  dynamic_int8: "int8 weights, activations quantized at run time (dynamic range)",
  int8: "int8 (calibrated ranges; see the recipe)",
  int8_ptq: "int8, post-training quantization",
};
const PALETTE = ["#ffd166", "#8ecae6", "#b5e48c", "#f4a3c4", "#cdb4db", "#ffb703", "#90e0ef", "#e9c46a"];

/** `model_int8_buckets.tflite` -> `{variant: "int8", buckets: true}`. */
export function fileVariant(name: string): { variant: string; buckets: boolean } {
  const stem = name.replace(/^.*\//, "").replace(/\.tflite$/, "");
  const buckets = stem.endsWith("_buckets");
  return { variant: stem.replace(/^model_/, "").replace(/_buckets$/, ""), buckets };
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
  return rows.flatMap(([term, value]) => {
    const dt = document.createElement("dt");
    dt.textContent = term;
    const dd = document.createElement("dd");
    dd.textContent = value;
    dd.dataset.field = term;
    return [dt, dd];
  });
}

/** The message for an error of loading or running `name`. */
export function describeError(error: unknown, name: string): string {
  if (error instanceof ModelAssetError || error instanceof RuntimeError) return error.message;
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
