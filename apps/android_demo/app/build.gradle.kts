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
            val needed = listOf("model_${variant.get()}.tflite", "vocab.txt", "labels.txt", "model_card.json")
            for (name in needed) {
                if (!File(dir, name).isFile) {
                    throw GradleException("$dir/$name is missing: -PartifactDir must be a `keras-attn export` " +
                        "directory; for another model file pass -PmodelVariant= (fp32, fp16, dynamic_int8, " +
                        "int8, int8_ptq; with length buckets fp32_buckets, dynamic_int8_buckets, int8_buckets; a CRF " +
                        "tagger has no model_int8.tflite, use int8_ptq)")
                }
            }
            @Suppress("UNCHECKED_CAST")
            val card = JsonSlurper().parse(File(dir, "model_card.json")) as Map<String, Any?>
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
            if (!selfDescribing) for (name in needed.drop(1)) File(dir, name).copyTo(File(target, name))
            val mediaPipe = listOf("model_${variant.get()}_mediapipe.tflite", "model_int8_mediapipe.tflite")
                .map { File(dir, it) }.firstOrNull { it.isFile }
            if (slot == "classify" && mediaPipe != null) mediaPipe.copyTo(File(target, "model_mediapipe.tflite"))
            File(target, "model_variant.txt").writeText(variant.get() + "\n")
            logger.lifecycle("copied $dir (${card["task"]}, model_${variant.get()}.tflite) -> $target")
        }
    }
}
