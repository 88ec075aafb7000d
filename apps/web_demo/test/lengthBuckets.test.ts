/** Which signature of a bucketed model an input runs on (Kotlin `LengthBucketsTest`). */
import { describe, expect, test } from "vitest";

import { LengthBuckets, ModelAssetError, TextTables, WordPieceTokenizer } from "../src/lib/core";

// The signatures of a CoNLL-2003 export (length 128), in the interpreter's order.
const conll = new LengthBuckets({
  serving_default: 128, tokens_16: 16, tokens_24: 24, tokens_32: 32, tokens_48: 48, tokens_64: 64, tokens_96: 96,
});

describe("LengthBuckets", () => {
  test("the shortest bucket that holds the tokens is picked", () => {
    expect(conll.buckets.map((b) => b.length)).toEqual([16, 24, 32, 48, 64, 96, 128]);
    expect(conll.sequenceLength).toBe(128);
    const picked = [1, 16, 17, 24, 25, 33, 64, 65, 96, 97, 128].map((n) => conll.pick(n).signature);
    expect(picked).toEqual([
      "tokens_16", "tokens_16", "tokens_24", "tokens_24", "tokens_32", "tokens_48",
      "tokens_64", "tokens_96", "tokens_96", "serving_default", "serving_default",
    ]);
  });

  test("a fixed-length file runs everything on its one signature", () => {
    const fixed = new LengthBuckets({ serving_default: 48 });
    expect(fixed.pick(1).signature).toBe("serving_default");
    expect(fixed.pick(48).length).toBe(48);
    expect(fixed.longest).toEqual({ signature: "serving_default", length: 48 });
  });

  test("encoded inputs are cut to the bucket", () => {
    const vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a", "good", "film"];
    const tokenizer = new WordPieceTokenizer(vocabulary, true, TextTables.load());
    const buckets = new LengthBuckets({ serving_default: 32, tokens_16: 16 });
    const inputs = tokenizer.encode("a good film", buckets.sequenceLength);
    const bucket = buckets.pick(inputs.length);
    expect(inputs.length).toBe(5);
    expect(bucket.signature).toBe("tokens_16");
    expect(Array.from(LengthBuckets.cut(inputs.tokenIds, bucket.length))).toEqual([2, 4, 5, 6, 3, ...Array(11).fill(0)]);
    // Only padding is cut.
    expect(inputs.paddingMask.subarray(bucket.length).every((m) => m === 0)).toBe(true);
    expect(() => LengthBuckets.cut(inputs.tokenIds, 33)).toThrow("cannot cut 32 ids to 33");
  });

  test("bad signatures and lengths are clear errors", () => {
    expect(() => new LengthBuckets({})).toThrow(new ModelAssetError("the model has no signature"));
    expect(() => new LengthBuckets({ serving_default: 16, tokens_16: 16 })).toThrow("both take 16 tokens");
    expect(() => new LengthBuckets({ serving_default: 16, tokens_32: 32 })).toThrow(
      "the default signature must be the longest",
    );
    expect(() => new LengthBuckets({ serving_default: 0 })).toThrow('signature "serving_default" has input length 0');
    expect(() => conll.pick(129)).toThrow("numTokens must be in [1, 128]");
    expect(() => conll.pick(0)).toThrow("numTokens must be in [1, 128]");
  });
});
