/**
 * A model asset (the `.tflite` file, its embedded model card, vocabulary or labels, the text
 * tables) is missing, malformed or disagrees with another: the port of the Kotlin core's
 * `AssetException`.
 *
 * The message says what is wrong, where (`file:line` or `file: field`) and how to fix it,
 * so an app can show it to the user as it is.
 *
 * Example:
 * ```ts
 * try {
 *   await readModelAssets(bytes, "notes.txt");
 * } catch (error) {
 *   if (error instanceof ModelAssetError) console.log(error.message);
 *   // "notes.txt is not a TFLite file (no TFL3 identifier at byte 4): ..."
 * }
 * ```
 */
export class ModelAssetError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "ModelAssetError";
  }
}
