package dev.kerasattn.core

import org.junit.Assert.assertEquals
import org.junit.Assert.fail
import org.junit.Test

/** The strict JSON reader: values, and errors that say where. */
class JsonTest {
    private fun error(text: String): String {
        try {
            Json.parse(text, "t.json")
        } catch (e: JsonException) {
            return e.message ?: ""
        }
        fail("no error for $text")
        return ""
    }

    @Test
    fun readsValuesAsPythonWroteThem() {
        val value = Json.parse("""{"a": [1, -2.5e-3, true, null, "x\"\u00e9\ud83d\ude00"], "b": {}}""") as Map<*, *>
        val list = value["a"] as List<*>
        assertEquals(1.0, list[0])
        assertEquals(-0.0025, list[1])
        assertEquals(true, list[2])
        assertEquals(null, list[3])
        assertEquals("x\"é\uD83D\uDE00", list[4])
        assertEquals(listOf("a", "b"), value.keys.toList())
        // Python's repr of a double reads back as the same double.
        assertEquals(0.1 + 0.2, Json.parse("0.30000000000000004"))
    }

    @Test
    fun malformedInputIsAnErrorWithLineAndColumn() {
        assertEquals("t.json:1:9: expected a string key", error("""{"a": 1,}"""))
        assertEquals("t.json:2:3: unexpected text after the value", error("[1]\n  2"))
        assertEquals("t.json:1:10: duplicate key \"a\"", error("""{"a": 1, "a": 2}"""))
        assertEquals("t.json:1:2: leading zero in a number", error("01"))
        assertEquals("t.json:1:1: unexpected character 'N', expected a value", error("NaN"))
        assertEquals("t.json:1:4: unterminated string", error("\"ab"))
        assertEquals("t.json:1:2: bad \\u escape \"\\u12G4\"", error("\"\\u12G4\""))
        assertEquals("t.json:1:1: unexpected end of input, expected a value", error(""))
        assertEquals("t.json:1:2: unescaped control character in a string", error("\"\n\""))
    }

    @Test
    fun typedFieldsNameTheFieldOnError() {
        val map = Json.parse("""{"n": 1.5, "s": 3}""") as Map<*, *>
        try {
            Json.intField(map, "n", "card")
            fail()
        } catch (e: JsonException) {
            assertEquals("card: \"n\" must be an integer, got 1.5", e.message)
        }
        try {
            Json.stringField(map, "s", "card")
            fail()
        } catch (e: JsonException) {
            assertEquals("card: \"s\" must be a string, got the number 3.0", e.message)
        }
        try {
            Json.listField(map, "missing", "card")
            fail()
        } catch (e: JsonException) {
            assertEquals("card: missing field \"missing\"", e.message)
        }
    }
}
