"""Hard cases for text processing: the strings every tokenizer and word splitter port (the
Python pipeline, the in-graph SavedModel, the Kotlin app) is checked on, and that the export
stage writes into the golden vectors.

Accents (precomposed and combining), CJK and other scripts, emoji with modifiers and ZWJ,
control, zero-width and private-use characters, odd whitespace, punctuation of many kinds,
over-long words and texts.
"""

TOKENIZER_HARD_CASES = [
    "",
    " ",
    "\t\n\r",
    "Héllo Wörld, naïve café résumé",  # accents (precomposed)
    "ÀÉÎÕÜ àéîõü Ççñ Ññ",
    "e\u0301 a\u0308 n\u0303 o\u0302 combining marks",  # decomposed accents
    "東京は日本の首都です。 北京 서울 こんにちは",  # CJK, Hangul, kana
    "I love 🤗 and 😀👍🏽 emoji 🇫🇷 hello😀world",
    "control\x00chars\x07here\x1b[0m and \x7f del",
    "a" * 101,  # over the 100-character / 100-byte word limit: [UNK] in both
    "b" * 100,
    "supercalifragilistic" * 6,
    "x" * 1000,
    "é" * 60,  # 120 bytes, but 60 once accents are stripped: within both limits
    "a\u0301" * 60,
    "MiXeD CaSe WoRdS iPhone McDonald's",
    "Ｆｕｌｌ－ｗｉｄｔｈ ＡＢＣ １２３",  # full-width Latin
    "Straße groß ß",
    "مرحبا بالعالم العربية",  # Arabic
    "zero\u200bwidth\u200c joiner\u200d and\ufeffbom",  # zero-width characters
    "tabs\tand\nnewlines\r\nmixed",
    "non\u00a0breaking\u2003spaces\u3000ideographic",
    "Ελληνικά Σίσυφος ΣΑΣ",  # Greek, word-final sigma
    "Привет мир",
    "don't won't U.S.A. e-mail 3.14 $100 50% #hashtag @user",
    "«quotes» „low“ ‘single’ — dashes … ellipsis",
    "ﬁ ligature ﬂ",
    "Ⅻ roman ① circled ㎏ squared",
    "İstanbul",
    "Ж" * 60,  # 60 characters, 120 bytes
    "日本語" * 40,
    "สวัสดีครับ",  # Thai
    "नमस्ते दुनिया",  # Devanagari
    "ｶﾀｶﾅ",  # half-width katakana
    "\ue000 private use",
    "Ǆ ǅ ǆ",
    "ω" * 50,  # 100 bytes: within tf-text's limit
    "ω" * 51,  # 102 bytes: over tf-text's byte limit, within HF's 100 characters
]

WORD_SPLITTER_HARD_CASES = [
    "",
    " ",
    "   \t\n\r  ",
    "Hello, world!",
    "J.R.R. Tolkien's   \"Hobbit\" (1937)",
    "Café naïve résumé Zürich São Paulo",
    "e\u0301te\u0301 \u0301alone a.\u0301b",  # combining marks: inside, alone, after punctuation
    "北京欢迎你 and 東京, 𠀀𪜀 ideographs",  # CJK incl. supplementary planes
    "ひらがな カタカナ 한국어",  # not CJK ideographs: ordinary words
    "emoji 😀👍🏽 and 👨‍👩‍👧 family",  # ZWJ (Cf) removed inside the word
    "tab\tnew\nline\r\ncarriage",
    "zero\u200bwidth soft\u00adhyphen bom\ufeffhere",
    "ctrl\x01char \x7f del \x00 nul \ufffd replacement",
    "nbsp\u00a0here ideographic\u3000space line\u2028para\u2029sep",
    "math ≠ ≮ ≯ 1+1=2 a<b>c ~x^y| $5 `q` ῾ ῭ ΅ `",
    "private\ue000use unassigned\u0378char",
    "full-width Ｈｅｌｌｏ！ ligature ﬁne",
    "«quotes» „low“ ‘single’ — dash – en ¿qué? ¡sí!",
    "\u200b\u200b",
    "a",
    "!!!",
    "x" * 300,
]

# Both lists, each string once, in order.
HARD_CASES = list(dict.fromkeys(TOKENIZER_HARD_CASES + WORD_SPLITTER_HARD_CASES))
