// The demo app: Classify and Entities tabs over exported keras-attn models, LiteRT Interpreter
// API (XNNPACK on the CPU), tokenization and decoding by the :core module.
import groovy.json.JsonSlurper

plugins {
    id("com.android.application")
    id("org.jetbrains.kotlin.android")
}

android {
    namespace = "dev.kerasattn.demo"
    compileSdk = 36

    defaultConfig {
        applicationId = "dev.kerasattn.demo"
        minSdk = 24
        targetSdk = 36
        versionCode = 1
        versionName = "1.0"
    }

    buildTypes {
        release {
            isMinifyEnabled = false
        }
    }

    compileOptions {
        sourceCompatibility = JavaVersion.VERSION_17
        targetCompatibility = JavaVersion.VERSION_17
    }

    // Memory-map the models straight from the APK: they must be stored uncompressed.
    androidResources {
        noCompress += "tflite"
    }
}

kotlin {
    compilerOptions {
        jvmTarget.set(org.jetbrains.kotlin.gradle.dsl.JvmTarget.JVM_17)
    }
}

dependencies {
    implementation(project(":core"))
    // LiteRT (formerly TensorFlow Lite) from Google's Maven; the Interpreter API lives in the
    // package org.tensorflow.lite. 1.4.2 is the current release of the Interpreter line.
    implementation("com.google.ai.edge.litert:litert:1.4.2")
    // MediaPipe Tasks' TextClassifier, the Classify tab's second engine (MediaPipeSlot).
    implementation("com.google.mediapipe:tasks-text:0.10.14")
    implementation("androidx.appcompat:appcompat:1.7.1")
    implementation("com.google.android.material:material:1.12.0")
}

// ./gradlew :app:copyModelAssets -PartifactDir=EXPORT_DIR[,EXPORT_DIR2] [-PmodelVariant=int8]
// Copies model_<variant>.tflite of each export directory (`keras-attn export` output) into
// assets/classify/ or assets/entities/, chosen by the card's task. A model file with TFLite
// metadata carries its card, vocabulary and labels; for one without, vocab.txt, labels.txt and
// model_card.json are copied beside it. A classifier's model_<variant>_mediapipe.tflite (else
// model_int8_mediapipe.tflite) becomes model_mediapipe.tflite, the MediaPipe engine's file.
val assetsRoot = layout.projectDirectory.dir("src/main/assets")

tasks.register("copyModelAssets") {
    group = "keras-attn"
    description = "Copies exported models into the app's assets (-PartifactDir=DIR[,DIR2], -PmodelVariant=int8)."
    val artifactDirs = providers.gradleProperty("artifactDir")
    val variant = providers.gradleProperty("modelVariant").orElse("int8")
    doLast {
        val dirs = artifactDirs.orNull?.split(",")?.map { it.trim() }?.filter { it.isNotEmpty() }
            ?: throw GradleException("pass -PartifactDir=EXPORT_DIR (a `keras-attn export` output directory; " +
                "comma-separate a classifier's and a tagger's)")
        for (path in dirs) {
            val dir = file(path)
            // The export directory's contract (docs/pipeline.md): model_card.json lists the
            // artifacts the export wrote; the app takes the variant's .tflite file from it.
            val cardFile = File(dir, "model_card.json")
            if (!cardFile.isFile) {
                throw GradleException("$cardFile is missing: -PartifactDir must be a `keras-attn export` " +
                    "directory (written by `keras-attn export RUN --output-dir $dir`)")
            }
            @Suppress("UNCHECKED_CAST")
            val card = JsonSlurper().parse(cardFile) as Map<String, Any?>
            @Suppress("UNCHECKED_CAST")
            val listed = card["artifacts"] as? List<Map<String, Any?>>
                ?: throw GradleException("$cardFile has no artifact list (an older export): re-run " +
                    "`keras-attn export RUN --output-dir $dir`")
            val tfliteFiles = listed.filter { it["kind"] == "tflite" }.map { it["file"] as String }
            val wanted = "model_${variant.get()}.tflite"
            if (wanted !in tfliteFiles) {
                throw GradleException("$dir has no $wanted: its model_card.json lists " +
                    "${tfliteFiles.joinToString()}; pass -PmodelVariant= with the part of one between " +
                    "model_ and .tflite")
            }
            val sideFiles = listOf("vocab.txt", "labels.txt", "model_card.json")
            for (name in listOf(wanted) + sideFiles) {
                if (!File(dir, name).isFile) {
                    throw GradleException("$dir/$name is missing: copy the export directory whole " +
                        "(written by `keras-attn export RUN --output-dir $dir`)")
                }
            }
            val slot = when (card["task"]) {
                "classification" -> "classify"
                "ner" -> "entities"
                else -> throw GradleException("$dir/model_card.json: task ${card["task"]} has no tab in the app")
            }
            val target = assetsRoot.dir(slot).asFile
            target.deleteRecursively()
            target.mkdirs()
            val model = File(dir, "model_${variant.get()}.tflite")
            model.copyTo(File(target, "model.tflite"))
            val selfDescribing = try {
                java.util.zip.ZipFile(model).use { it.getEntry("model_card.json") != null }
            } catch (e: java.util.zip.ZipException) {
                false  // no associated files appended
            }
            if (!selfDescribing) for (name in sideFiles) File(dir, name).copyTo(File(target, name))
            val mediaPipe = listOf("model_${variant.get()}_mediapipe.tflite", "model_int8_mediapipe.tflite")
                .map { File(dir, it) }.firstOrNull { it.isFile }
            if (slot == "classify" && mediaPipe != null) mediaPipe.copyTo(File(target, "model_mediapipe.tflite"))
            File(target, "model_variant.txt").writeText(variant.get() + "\n")
            logger.lifecycle("copied $dir (${card["task"]}, model_${variant.get()}.tflite) -> $target")
        }
    }
}
