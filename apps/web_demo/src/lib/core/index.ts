/**
 * The pure core of keras-attn's web library: everything between a text and the model's
 * tensors, and between its logits and the result, with no browser dependency (Node runs it):
 * the port of the Android app's Kotlin core (`apps/android_demo/core`), checked against the
 * same golden vectors.
 *
 * Example (a classifier, the model run by LiteRT.js in between):
 * ```ts
 * import { readModelAssets, LengthBuckets, classificationResult } from "./core";
 *
 * const { card, tokenizer } = await readModelAssets(bytes, "model_int8_buckets.tflite");
 * const inputs = tokenizer.encode("a good film", card.sequenceLength);
 * const bucket = buckets.pick(inputs.length);   // buckets: new LengthBuckets(signature lengths)
 * // logits = run bucket.signature on LengthBuckets.cut(inputs.tokenIds, bucket.length), ...
 * classificationResult(card.labels, logits);  // {label, probabilities}, as `keras-attn predict --json`
 * ```
 *
 * Offsets are Unicode code points (Python `str` indices), never UTF-16 units.
 */
export { codePointsOf, sliceCodePoints, stringOfCodePoints, toUtf16Index, utf8Length } from "./codePoints";
export { CrfTransitions, type Precision } from "./crf";
export { ModelAssetError } from "./errors";
export { parseJson } from "./json";
export { type Bucket, LengthBuckets } from "./lengthBuckets";
export { ModelCard, type Task, type TokenizerSettings } from "./modelCard";
export {
  CARD_FILE,
  LABELS_FILE,
  type ModelAssets,
  VOCABULARY_FILE,
  isTFLite,
  readAssociatedFiles,
  readModelAssets,
} from "./modelFile";
export {
  type EntitySpan,
  type Entities,
  type TaggerInputs,
  type Word,
  decodeNer,
  entitySpans,
  firstPiecePositions,
  isIobTag,
  prepareNer,
  repairIob2,
  splitWords,
} from "./ner";
export {
  type ClassificationResult,
  type NerEntity,
  type NerResult,
  type NerWord,
  type PredictResult,
  classificationResult,
  nerResult,
} from "./results";
export { argmax, softmax, topK } from "./scores";
export { CharClass, TEXT_TABLES_SOURCE, TextTables } from "./textTables";
export { type ModelInputs, type Pieces, type WordPieceOptions, WordPieceTokenizer } from "./wordPieceTokenizer";
export {
  type BeamSearchOptions,
  type DecodeOptions,
  type DecodeProgress,
  type DecodeStep,
  type Decoded,
  type StepOutput,
  beamSearch,
  greedyDecode,
} from "./decoding";
export { JOINER_TOKEN, JoinedWordPieces } from "./joinedWordPieces";
export {
  type TranslationAssets,
  type TranslationCard,
  parseTranslationCard,
  readTranslationAssets,
  sourceBucket,
  sourceIds,
  translationText,
} from "./translationFile";
export { CHARACTERS_FILE, type CodecKind, TextCodec, TextStream, UNFINISHED, WORDPIECE_FILE } from "./textCodec";
export {
  type GeneratedTokens,
  type GenerateTokensOptions,
  type SamplingOptions,
  type TokenStep,
  checkSampling,
  generateTokens,
  processLogits,
  randomSeed,
  sampleFromLogits,
  scaleByTemperature,
  seededUniforms,
  softmax32,
  topKFilter,
  topPFilter,
} from "./sampling";
export {
  GENERATION_TASK,
  type GenerationAssets,
  type GenerationCard,
  GenerationError,
  newTokenBudget,
  parseGenerationCard,
  readGenerationAssets,
} from "./generationFile";
