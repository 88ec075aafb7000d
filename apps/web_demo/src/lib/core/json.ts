import { ModelAssetError } from "./errors";

/** A parsed JSON object. */
export type JsonObject = { readonly [key: string]: unknown };

/**
 * `JSON.parse` with errors that name the document: `source:line:column: ...` where the
 * engine reports a position, else `source: ...` (the Kotlin core's `Json.parse`).
 *
 * Numbers are parsed as Python's `float()` parses them (correctly rounded doubles), so a
 * value written by Python's `json` reads back as the same double. Unlike the Kotlin reader,
 * a repeated key keeps its last value (as `JSON.parse` and Python's `json` do).
 *
 * Example:
 * ```ts
 * parseJson('{"a": }', "model_card.json");  // throws ModelAssetError "model_card.json: not valid JSON (...)"
 * ```
 *
 * @throws ModelAssetError on malformed input.
 */
export function parseJson(text: string, source: string): unknown {
  try {
    return JSON.parse(text);
  } catch (error) {
    const message = error instanceof Error ? error.message : String(error);
    const position = /at position (\d+)/.exec(message);
    let where = source;
    if (position !== null) {
      const before = text.slice(0, Number(position[1])).split("\n");
      where += `:${before.length}:${before[before.length - 1]!.length + 1}`;
    }
    throw new ModelAssetError(`${where}: not valid JSON (${message})`);
  }
}

/** `value` as an object, or a {@link ModelAssetError} saying `what` must be one. */
export function asObject(value: unknown, what: string): JsonObject {
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw new ModelAssetError(`${what} must be an object, got ${describe(value)}`);
  }
  return value as JsonObject;
}

/** `object[key]`, which must be present. */
export function field(object: JsonObject, key: string, where: string): unknown {
  if (!Object.hasOwn(object, key)) {
    throw new ModelAssetError(`${where}: missing field "${key}"`);
  }
  return object[key];
}

/** `object[key]` as an object. */
export function objectField(object: JsonObject, key: string, where: string): JsonObject {
  return asObject(field(object, key, where), `${where}: "${key}"`);
}

/** `object[key]` as an array. */
export function arrayField(object: JsonObject, key: string, where: string): readonly unknown[] {
  const value = field(object, key, where);
  if (!Array.isArray(value)) throw wrongType(where, key, value, "an array");
  return value;
}

/** `object[key]` as a string. */
export function stringField(object: JsonObject, key: string, where: string): string {
  const value = field(object, key, where);
  if (typeof value !== "string") throw wrongType(where, key, value, "a string");
  return value;
}

/** `object[key]` as a boolean. */
export function booleanField(object: JsonObject, key: string, where: string): boolean {
  const value = field(object, key, where);
  if (typeof value !== "boolean") throw wrongType(where, key, value, "true or false");
  return value;
}

/** `object[key]` as an integer (a number without fraction within the int32 range). */
export function intField(object: JsonObject, key: string, where: string): number {
  return toInt(field(object, key, where), `${where}: "${key}"`);
}

/** A JSON number that must be an integer; `what` names it in the error. */
export function toInt(value: unknown, what: string): number {
  if (typeof value !== "number" || !Number.isInteger(value) || Math.abs(value) > 0x7fffffff) {
    throw new ModelAssetError(`${what} must be an integer, got ${describe(value)}`);
  }
  return value;
}

/** A JSON array of integers. */
export function toInts(value: unknown, what: string): number[] {
  if (!Array.isArray(value)) throw new ModelAssetError(`${what} must be an array, got ${describe(value)}`);
  return value.map((item, i) => toInt(item, `${what}[${i}]`));
}

/** A JSON array of numbers. */
export function toNumbers(value: unknown, what: string): number[] {
  if (!Array.isArray(value)) throw new ModelAssetError(`${what} must be an array, got ${describe(value)}`);
  return value.map((item, i) => {
    if (typeof item !== "number") throw new ModelAssetError(`${what}[${i}] must be a number, got ${describe(item)}`);
    return item;
  });
}

function wrongType(where: string, key: string, value: unknown, expected: string): ModelAssetError {
  return new ModelAssetError(`${where}: "${key}" must be ${expected}, got ${describe(value)}`);
}

function describe(value: unknown): string {
  if (value === null) return "null";
  if (Array.isArray(value)) return "an array";
  if (typeof value === "string") return "a string";
  if (typeof value === "number") return `the number ${value}`;
  if (typeof value === "boolean") return String(value);
  if (typeof value === "object") return "an object";
  return typeof value;
}
