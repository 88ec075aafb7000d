/** The bundled tables and the errors of malformed ones (Kotlin `ModelCardTest.tablesReportMalformedLines`). */
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, test } from "vitest";

import { CharClass, ModelAssetError, TextTables } from "../src/lib/core";
import { TEXT_TABLES_SOURCE } from "../src/lib/core/textTables";

const REPO = fileURLToPath(new URL("../../..", import.meta.url));

const read = (text: string) => () => TextTables.read(text, "t.txt");

describe("TextTables", () => {
  test("the bundled tables are the library's file", () => {
    // The repository's one copy (the Android core's build copies it too: tests/test_golden_vectors.py).
    const library = readFileSync(join(REPO, TEXT_TABLES_SOURCE));
    // The parsed bundle is that file: a table read from it answers the same.
    const read = TextTables.read(library.toString("ascii"), TEXT_TABLES_SOURCE);
    for (const c of [0xc9, 0xdf, 0x2026, 0xac01, 0x200b]) expect(TextTables.load().normalize(c, true)).toEqual(read.normalize(c, true));
  });

  test("the bundled tables answer as HF's BertNormalizer", () => {
    const tables = TextTables.load();
    expect(TextTables.load()).toBe(tables); // parsed once
    expect(tables.normalize(0xc9, true)).toEqual([0x65]); // "É" -> "e"
    expect(tables.normalize(0xc9, false)).toEqual([0xc9]);
    // Values of HF tokenizers' BertNormalizer (0.22.2): no case folding, no compatibility mapping.
    expect(tables.normalize(0xdf, true)).toEqual([0xdf]); // "ß" stays (not "ss")
    expect(tables.normalize(0x2026, true)).toEqual([0x2026]); // "…" stays (not "...")
    expect(tables.normalize(0x133, true)).toEqual([0x133]); // "ĳ" stays (not "ij")
    expect(tables.normalize(0xb4, true)).toEqual([0xb4]); // "´" stays (not a space + U+0301)
    expect(tables.normalize(0xff21, true)).toEqual([0xff41]); // full-width "Ａ" -> "ａ"
    expect(tables.normalize(0xff21, false)).toEqual([0xff21]);
    expect(tables.normalize(0x200b, true)).toEqual([]); // zero-width space removed
    expect(tables.normalize(0x200b, false)).toEqual([]);
    expect(tables.normalize(0x07, false)).toEqual([]); // control removed, not a space
    expect(tables.normalize(0x09, false)).toEqual([0x20]);
    expect(tables.normalize(0xe000, true)).toEqual([]); // private use removed
    expect(tables.normalize(0x5317, true)).toEqual([0x5317]); // CJK: not padded here, class SINGLE
    expect(tables.tokenizerClass(0x5317)).toBe(CharClass.SINGLE);
    expect(tables.normalize(0xd800, false)).toEqual([]); // lone surrogate
    expect(tables.normalize(0xac01, true)).toEqual([0x1100, 0x1161, 0x11a8]); // Hangul "각"
    expect(tables.tokenizerClass(0x20)).toBe(CharClass.WHITESPACE);
    expect(tables.tokenizerClass(0x2c)).toBe(CharClass.SINGLE);
    expect(tables.tokenizerClass(0x61)).toBe(CharClass.WORD);
    expect(tables.wordClass(0x301, true)).toBe(CharClass.REMOVED);
    expect(tables.wordClass(0x301, false)).toBe(CharClass.WORD);
  });

  test("malformed tables name the line", () => {
    expect(read("table normalize_uncased 1\nR 41 26 1\nend\n")).toThrow(new ModelAssetError('t.txt:2: bad line "R 41 26 1"'));
    expect(read("table normalize_uncased 0\n")).toThrow(new ModelAssetError('t.txt: no "end" line (truncated file?)'));
    expect(read("table normalize_uncased 2\nH AC00 D7A3\nend\n")).toThrow(
      "t.txt:3: table normalize_uncased has 1 lines, its header says 2 (truncated file?)",
    );
    expect(read("# comment\nC 0 W\n")).toThrow("t.txt:2: line outside a table");
    expect(read("table normalize_uncased 1\nT 4G 1 1 20\nend\n")).toThrow('t.txt:2: "4G" is not a hexadecimal code point');
    expect(read("table normalize_uncased 0\nend\ntable x 0\n")).toThrow('t.txt:3: text after "end"');
    expect(read("table normalize_uncased 0\nend\n")).toThrow('t.txt: table "normalize_cased" is missing');
  });

  test("class tables must start at U+0000 and increase", () => {
    const header = "table normalize_uncased 0\ntable normalize_cased 0\n";
    const rest = "table word_classes_strip_accents 1\nC 0 W\ntable word_classes_keep_accents 1\nC 0 W\nend\n";
    expect(read(`${header}table tokenizer_classes 1\nC 1 W\n${rest}`)).toThrow("t.txt: a class table must start at U+0000");
    expect(read(`${header}table tokenizer_classes 2\nC 0 W\nC 0 S\n${rest}`)).toThrow(
      "t.txt:5: class runs must be in increasing order",
    );
    expect(read(`${header}table tokenizer_classes 1\nC 0 R\n${rest}`)).toThrow('t.txt:4: bad class line "C 0 R"');
    const tables = TextTables.read(`${header}table tokenizer_classes 2\nC 0 W\nC 20 S\n${rest}`, "t.txt");
    const classes = [0x1f, 0x20, 0x10ffff].map((c) => tables.tokenizerClass(c));
    expect(classes).toEqual([CharClass.WORD, CharClass.WHITESPACE, CharClass.WHITESPACE]);
  });
});
