package dev.kerasattn.core

import org.junit.Assert.fail

/** The message of the [AssetException] that `block` throws; fails the test when it throws none. */
fun assetError(block: () -> Unit): String {
    try {
        block()
    } catch (e: AssetException) {
        return e.message ?: ""
    }
    fail("no AssetException")
    return ""
}
