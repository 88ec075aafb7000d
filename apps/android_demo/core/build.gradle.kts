// The text core: plain Kotlin on the JVM, no Android. The same sources are compiled by
// run_jvm_tests.sh with Debian's kotlinc 1.3 in CI, so they use only what Kotlin 1.3 accepts.
import org.jetbrains.kotlin.gradle.dsl.JvmTarget

plugins {
    id("org.jetbrains.kotlin.jvm")
}

java {
    sourceCompatibility = JavaVersion.VERSION_17
    targetCompatibility = JavaVersion.VERSION_17
}

kotlin {
    compilerOptions {
        jvmTarget.set(JvmTarget.JVM_17)
    }
}

dependencies {
    testImplementation("junit:junit:4.13.2")
}

// BERT text tables (TextTables.RESOURCE): the Python library's file, written by
// tools/make_text_tables.py and imported by the web core too, copied onto the class path here
// instead of a committed copy, so that the two cores cannot drift apart.
val bertTextTables = rootProject.file("../../keras_attn/text/bert_text_tables.txt")

tasks.processResources {
    from(bertTextTables) { into("dev/kerasattn/core") }
}

// Golden vectors for the parity test: `./gradlew :core:test -PgoldenRoot=/path/to/golden`
// (written by tools/make_golden_vectors.py or `keras-attn export`). Without them the
// parity test is left out and the unit tests still run.
val goldenRoot = providers.gradleProperty("goldenRoot").orNull

tasks.test {
    testLogging {
        events("passed", "failed")
        showStandardStreams = true
    }
    if (goldenRoot != null) {
        systemProperty("golden.root", file(goldenRoot).absolutePath)
    } else {
        exclude("**/GoldenParityTest*")
        doFirst { logger.lifecycle("GoldenParityTest skipped: pass -PgoldenRoot=DIR to run it") }
    }
}
