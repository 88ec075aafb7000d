/**
 * A copy of a `.tflite` file with one int8 weight nudged: the mutation the parity rules
 * (e2e/parity.ts) must catch. Reads just enough of the TFLite flatbuffer (schema.fbs: Model,
 * SubGraph, Tensor, Operator, Buffer) to find the int8 constant tensor that the last operator
 * of the first subgraph with one reads (the classifier or tagger head's kernel), and changes
 * one of its bytes in place of the copy; the rest of the file, appended metadata included, is
 * left as it was.
 */

/** `Tensor.type` of an int8 tensor (schema.fbs `TensorType.INT8`). */
const INT8 = 9;

/** A nudged copy and what was changed. */
export interface NudgedFile {
  readonly bytes: Uint8Array;
  /** The tensor's name in the file. */
  readonly tensor: string;
  /** The changed element's byte offset in the file. */
  readonly offset: number;
  readonly before: number;
  readonly after: number;
}

/** A flatbuffer table: its fields by schema index. */
class Table {
  constructor(private readonly view: DataView, readonly at: number) {}

  private field(index: number): number {
    const vtable = this.at - this.view.getInt32(this.at, true);
    const size = this.view.getUint16(vtable, true);
    const slot = 4 + 2 * index;
    return slot < size ? this.view.getUint16(vtable + slot, true) : 0;
  }

  /** A scalar field, or `fallback` when absent. */
  scalar(index: number, kind: "u8" | "u32", fallback = 0): number {
    const offset = this.field(index);
    if (offset === 0) return fallback;
    return kind === "u8" ? this.view.getUint8(this.at + offset) : this.view.getUint32(this.at + offset, true);
  }

  /** Where a vector field's elements start and how many there are (`[0, 0]` when absent). */
  vector(index: number): [start: number, length: number] {
    const offset = this.field(index);
    if (offset === 0) return [0, 0];
    const at = this.at + offset + this.view.getUint32(this.at + offset, true);
    return [at + 4, this.view.getUint32(at, true)];
  }

  tables(index: number): Table[] {
    const [start, length] = this.vector(index);
    return Array.from({ length }, (_, i) => start + 4 * i).map((at) => new Table(this.view, at + this.view.getUint32(at, true)));
  }

  ints(index: number): number[] {
    const [start, length] = this.vector(index);
    return Array.from({ length }, (_, i) => this.view.getInt32(start + 4 * i, true));
  }

  string(index: number): string {
    const [start, length] = this.vector(index);
    return new TextDecoder().decode(new Uint8Array(this.view.buffer, this.view.byteOffset + start, length));
  }
}

/**
 * Copies `file` and moves one int8 weight of the model's head by `by` steps.
 *
 * Example:
 * ```ts
 * const nudged = nudgeInt8Weight(readFileSync("model_int8.tflite"), 64);
 * writeFileSync("/tmp/nudged.tflite", nudged.bytes);
 * ```
 *
 * @param file the whole `.tflite` file.
 * @param by int8 steps (1 to 127) the first element moves, towards the other sign (so it stays
 *   in range).
 * @returns the nudged copy, the tensor's name, the byte's offset, its values before and after.
 * @throws Error when the file is no TFLite flatbuffer, has no int8 constant weight, or `by` is
 *   not an integer from 1 to 127.
 */
export function nudgeInt8Weight(file: Uint8Array, by: number): NudgedFile {
  if (file.length < 8 || String.fromCharCode(...file.subarray(4, 8)) !== "TFL3") {
    throw new Error(`nudgeInt8Weight needs a .tflite file (file identifier TFL3 at byte 4). Received: ${file.length} bytes`);
  }
  if (!Number.isInteger(by) || by < 1 || by > 127) {
    throw new Error(`nudgeInt8Weight moves a weight by 1 to 127 int8 steps (towards the other sign, so it stays in range). Received: by=${by}`);
  }
  const bytes = new Uint8Array(file);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const model = new Table(view, view.getUint32(0, true));
  const buffers = model.tables(4);
  for (const subgraph of model.tables(2)) {
    const tensors = subgraph.tables(0);
    const constant = (index: number) => {
      if (index < 0) return false; // an optional input left out
      const tensor = tensors[index];
      return tensor.scalar(1, "u8") === INT8 && buffers[tensor.scalar(2, "u32")].vector(0)[1] > 0;
    };
    for (const operator of subgraph.tables(3).reverse()) {
      const weight = operator.ints(1).find(constant);
      if (weight === undefined) continue;
      const tensor = tensors[weight];
      const [offset] = buffers[tensor.scalar(2, "u32")].vector(0);
      const before = view.getInt8(offset);
      const after = before >= 0 ? before - by : before + by;
      view.setInt8(offset, after);
      return { bytes, tensor: tensor.string(3), offset, before, after };
    }
  }
  throw new Error(`nudgeInt8Weight found no operator reading an int8 constant tensor: is it a full-int8 file? Received: ${file.length} bytes`);
}
