package dev.kerasattn.core

/** A JSON document that is not what the reader expects: where (line:column or field) and why. */
class JsonException(message: String) : IllegalArgumentException(message)

/**
 * A small, strict JSON reader (RFC 8259): objects become `Map<String, Any?>` (insertion order),
 * arrays `List<Any?>`, numbers `Double`, plus `String`, `Boolean` and `null`.
 *
 * Strict: no comments, trailing commas, single quotes, NaN, leading zeros or duplicate keys;
 * anything after the value is an error. `\uXXXX` escapes are copied as UTF-16 units, so a
 * surrogate pair (Python's `ensure_ascii` output for emoji) becomes the one character.
 * Numbers go through `java.lang.Double.parseDouble`, which rounds exactly as Python's `float()`
 * does, so a value written by Python's `json` reads back as the same double.
 *
 * Example:
 * ```
 * val card = Json.parse("""{"labels": ["neg", "pos"], "sequence_length": 128}""") as Map<*, *>
 * Json.intField(card, "sequence_length", "model_card.json")  // 128
 * ```
 */
class Json private constructor(private val text: String, private val source: String) {
    private var position = 0

    companion object {
        /**
         * Parses one JSON value.
         *
         * @param text the document.
         * @param source a name for error messages (file name, "line 12 of golden_vectors.jsonl").
         * @return the value (see the class documentation for the types).
         * @throws JsonException with `source:line:column` on malformed input.
         */
        @JvmStatic
        fun parse(text: String, source: String = "JSON"): Any? {
            val reader = Json(text, source)
            reader.skipWhitespace()
            val value = reader.readValue(0)
            reader.skipWhitespace()
            if (reader.position != text.length) reader.fail("unexpected text after the value")
            return value
        }

        /** `map[key]` as an object, or a [JsonException] naming `where` and the key. */
        @JvmStatic
        fun objectField(map: Map<*, *>, key: String, where: String): Map<*, *> =
            field(map, key, where) as? Map<*, *> ?: wrongType(map, key, where, "an object")

        /** `map[key]` as an array. */
        @JvmStatic
        fun listField(map: Map<*, *>, key: String, where: String): List<*> =
            field(map, key, where) as? List<*> ?: wrongType(map, key, where, "an array")

        /** `map[key]` as a string. */
        @JvmStatic
        fun stringField(map: Map<*, *>, key: String, where: String): String =
            field(map, key, where) as? String ?: wrongType(map, key, where, "a string")

        /** `map[key]` as a boolean. */
        @JvmStatic
        fun booleanField(map: Map<*, *>, key: String, where: String): Boolean =
            field(map, key, where) as? Boolean ?: wrongType(map, key, where, "true or false")

        /** `map[key]` as a number. */
        @JvmStatic
        fun doubleField(map: Map<*, *>, key: String, where: String): Double =
            field(map, key, where) as? Double ?: wrongType(map, key, where, "a number")

        /** `map[key]` as an integer (a number without fraction within the Int range). */
        @JvmStatic
        fun intField(map: Map<*, *>, key: String, where: String): Int =
            toInt(field(map, key, where), "$where: \"$key\"")

        /** A JSON number that must be an integer, as Int; `what` names it in the error. */
        @JvmStatic
        fun toInt(value: Any?, what: String): Int {
            val number = value as? Double ?: throw JsonException("$what must be an integer, got ${describe(value)}")
            if (number != Math.rint(number) || number < Int.MIN_VALUE || number > Int.MAX_VALUE) {
                throw JsonException("$what must be an integer, got $number")
            }
            return number.toInt()
        }

        /** A JSON array of integers as an IntArray. */
        @JvmStatic
        fun toIntArray(value: Any?, what: String): IntArray {
            val list = value as? List<*> ?: throw JsonException("$what must be an array, got ${describe(value)}")
            val result = IntArray(list.size)
            for (i in list.indices) result[i] = toInt(list[i], "$what[$i]")
            return result
        }

        /** A JSON array of numbers as a DoubleArray. */
        @JvmStatic
        fun toDoubleArray(value: Any?, what: String): DoubleArray {
            val list = value as? List<*> ?: throw JsonException("$what must be an array, got ${describe(value)}")
            val result = DoubleArray(list.size)
            for (i in list.indices) {
                result[i] = list[i] as? Double ?: throw JsonException("$what[$i] must be a number, got ${describe(list[i])}")
            }
            return result
        }

        private fun field(map: Map<*, *>, key: String, where: String): Any? {
            if (!map.containsKey(key)) throw JsonException("$where: missing field \"$key\"")
            return map[key]
        }

        private fun wrongType(map: Map<*, *>, key: String, where: String, expected: String): Nothing =
            throw JsonException("$where: \"$key\" must be $expected, got ${describe(map[key])}")

        private fun describe(value: Any?): String = when (value) {
            null -> "null"
            is String -> "a string"
            is Double -> "the number $value"
            is Boolean -> "$value"
            is List<*> -> "an array"
            is Map<*, *> -> "an object"
            else -> value.javaClass.simpleName
        }

        private const val MAX_DEPTH = 200
    }

    private fun fail(reason: String): Nothing {
        var line = 1
        var column = 1
        for (i in 0 until minOf(position, text.length)) {
            if (text[i] == '\n') {
                line += 1
                column = 1
            } else {
                column += 1
            }
        }
        throw JsonException("$source:$line:$column: $reason")
    }

    private fun skipWhitespace() {
        while (position < text.length) {
            val c = text[position]
            if (c == ' ' || c == '\t' || c == '\n' || c == '\r') position += 1 else return
        }
    }

    private fun readValue(depth: Int): Any? {
        if (depth > MAX_DEPTH) fail("nesting deeper than $MAX_DEPTH levels")
        if (position >= text.length) fail("unexpected end of input, expected a value")
        val c = text[position]
        return when {
            c == '{' -> readObject(depth)
            c == '[' -> readArray(depth)
            c == '"' -> readString()
            c == '-' || (c in '0'..'9') -> readNumber()
            text.startsWith("true", position) -> { position += 4; true }
            text.startsWith("false", position) -> { position += 5; false }
            text.startsWith("null", position) -> { position += 4; null }
            else -> fail("unexpected character '${c}', expected a value")
        }
    }

    private fun readObject(depth: Int): Map<String, Any?> {
        val result = LinkedHashMap<String, Any?>()
        position += 1
        skipWhitespace()
        if (position < text.length && text[position] == '}') {
            position += 1
            return result
        }
        while (true) {
            skipWhitespace()
            if (position >= text.length || text[position] != '"') fail("expected a string key")
            val keyStart = position
            val key = readString()
            if (result.containsKey(key)) {
                position = keyStart
                fail("duplicate key \"$key\"")
            }
            skipWhitespace()
            expect(':')
            skipWhitespace()
            result[key] = readValue(depth + 1)
            skipWhitespace()
            if (position >= text.length) fail("unexpected end of input in an object")
            if (text[position] == ',') {
                position += 1
                continue
            }
            expect('}')
            return result
        }
    }

    private fun readArray(depth: Int): List<Any?> {
        val result = ArrayList<Any?>()
        position += 1
        skipWhitespace()
        if (position < text.length && text[position] == ']') {
            position += 1
            return result
        }
        while (true) {
            skipWhitespace()
            result.add(readValue(depth + 1))
            skipWhitespace()
            if (position >= text.length) fail("unexpected end of input in an array")
            if (text[position] == ',') {
                position += 1
                continue
            }
            expect(']')
            return result
        }
    }

    private fun expect(c: Char) {
        if (position >= text.length || text[position] != c) {
            fail(if (position >= text.length) "unexpected end of input, expected '$c'" else "expected '$c'")
        }
        position += 1
    }

    private fun readString(): String {
        position += 1
        val out = StringBuilder()
        while (true) {
            if (position >= text.length) fail("unterminated string")
            val c = text[position]
            when {
                c == '"' -> {
                    position += 1
                    return out.toString()
                }
                c == '\\' -> {
                    if (position + 1 >= text.length) fail("unterminated escape")
                    val e = text[position + 1]
                    position += 2
                    when (e) {
                        '"' -> out.append('"')
                        '\\' -> out.append('\\')
                        '/' -> out.append('/')
                        'b' -> out.append('\b')
                        'f' -> out.append('\u000C')
                        'n' -> out.append('\n')
                        'r' -> out.append('\r')
                        't' -> out.append('\t')
                        'u' -> {
                            if (position + 4 > text.length) fail("incomplete \\u escape")
                            val hex = text.substring(position, position + 4)
                            for (h in hex) {
                                if (!((h in '0'..'9') || (h in 'a'..'f') || (h in 'A'..'F'))) {
                                    position -= 2
                                    fail("bad \\u escape \"\\u$hex\"")
                                }
                            }
                            out.append(Integer.parseInt(hex, 16).toChar())
                            position += 4
                        }
                        else -> {
                            position -= 2
                            fail("unknown escape '\\$e'")
                        }
                    }
                }
                c < ' ' -> fail("unescaped control character in a string")
                else -> {
                    out.append(c)
                    position += 1
                }
            }
        }
    }

    private fun readNumber(): Double {
        val start = position
        if (text[position] == '-') position += 1
        if (position >= text.length) fail("incomplete number")
        if (text[position] == '0') {
            position += 1
            if (position < text.length && text[position] in '0'..'9') fail("leading zero in a number")
        } else if (text[position] in '1'..'9') {
            while (position < text.length && text[position] in '0'..'9') position += 1
        } else {
            fail("malformed number")
        }
        if (position < text.length && text[position] == '.') {
            position += 1
            if (position >= text.length || text[position] !in '0'..'9') fail("malformed fraction")
            while (position < text.length && text[position] in '0'..'9') position += 1
        }
        if (position < text.length && (text[position] == 'e' || text[position] == 'E')) {
            position += 1
            if (position < text.length && (text[position] == '+' || text[position] == '-')) position += 1
            if (position >= text.length || text[position] !in '0'..'9') fail("malformed exponent")
            while (position < text.length && text[position] in '0'..'9') position += 1
        }
        return java.lang.Double.parseDouble(text.substring(start, position))
    }
}
