/**
 * Code points of JavaScript (UTF-16) strings, and conversions between the two kinds of index:
 * the Kotlin core's `CodePoints`.
 *
 * Every offset of this library counts Unicode code points (Python `str` indices), never UTF-16
 * units: "😀" is one code point but two units of a JS string. Use {@link toUtf16Index} or
 * {@link sliceCodePoints} to go from an offset to a JS string position.
 *
 * Example:
 * ```ts
 * codePointsOf("😀a");               // Int32Array [0x1F600, 0x61]
 * sliceCodePoints("😀 the cat", 2, 5);  // "the"
 * toUtf16Index("😀 the", 2);          // 3
 * ```
 */

/** The code points of `text`; a lone surrogate is a code point of its own. */
export function codePointsOf(text: string): Int32Array {
  const result = new Int32Array(text.length);
  let count = 0;
  for (let index = 0; index < text.length; ) {
    const c = text.codePointAt(index)!;
    result[count++] = c;
    index += c > 0xffff ? 2 : 1;
  }
  return result.slice(0, count);
}

/** The UTF-16 index of code-point offset `offset` of `text` (for `substring`, DOM ranges). */
export function toUtf16Index(text: string, offset: number): number {
  if (!Number.isInteger(offset) || offset < 0) {
    throw new RangeError(`offset must be an integer >= 0, got ${offset}`);
  }
  let index = 0;
  for (let i = 0; i < offset; i++) {
    if (index >= text.length) {
      throw new RangeError(`offset ${offset} is beyond the text's ${i} code points`);
    }
    index += text.codePointAt(index)! > 0xffff ? 2 : 1;
  }
  return index;
}

/** `text[start:end]` in Python terms: the code points `[start, end)` of `text`. */
export function sliceCodePoints(text: string, start: number, end: number): string {
  const from = toUtf16Index(text, start);
  return text.substring(from, from + toUtf16Index(text.substring(from), end - start));
}

/** A string of `codePoints[from, to)`. */
export function stringOfCodePoints(
  codePoints: ArrayLike<number>,
  from = 0,
  to = codePoints.length,
): string {
  let out = "";
  for (let i = from; i < to; i++) out += String.fromCodePoint(codePoints[i]!);
  return out;
}

/** UTF-8 length of one code point (3 for a lone surrogate, as a replacement character). */
export function utf8Length(codePoint: number): number {
  if (codePoint < 0x80) return 1;
  if (codePoint < 0x800) return 2;
  if (codePoint < 0x10000) return 3;
  return 4;
}
