/**
 * keras-attn in the browser: load a self-describing `.tflite` file written by
 * `keras-attn export` and predict on text, with the same results as `keras-attn predict --json`.
 *
 * @example
 * ```ts
 * import { loadModel } from "keras-attn-web";
 *
 * const model = await loadModel("/models/model_int8_buckets.tflite");
 * console.log(model.card.task, model.card.labels);
 * console.log(await model.predict("Priya Nair met officials in Dublin."));
 *
 * const translator = await loadTranslator("/models/translation_int8.tflite");
 * console.log((await translator.translate("A man rides a bike.", { beams: 4 })).text);
 *
 * const generator = await loadGenerator("/models/generation_int8.tflite");
 * await generator.generate("ROMEO:", { maxNewTokens: 100, onText: (piece) => console.log(piece) });
 * ```
 * @packageDocumentation
 */
export { loadModel, TextModel } from "./model";
export type { LoadModelOptions, ModelSource, PredictResult, Run, Timing } from "./model";
export { loadTranslator, TranslationModel } from "./translator";
export type { TranslateOptions, Translation } from "./translator";
export { GenerationModel, loadGenerator } from "./generator";
export type { GenerateOptions, Generation, GenerationProgress } from "./generator";
export { defaultWasmPath, ensureRuntime, hasWasmSimd, RuntimeError } from "./runtime";
export type { RuntimeOptions } from "./runtime";
export * from "./core/index";
