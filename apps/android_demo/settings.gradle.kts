// keras-attn Android demo: a pure-Kotlin text core (JVM library, tested against the Python
// reference) and the app that runs exported LiteRT models with it.
pluginManagement {
    repositories {
        google()
        mavenCentral()
        gradlePluginPortal()
    }
}

dependencyResolutionManagement {
    repositoriesMode.set(RepositoriesMode.FAIL_ON_PROJECT_REPOS)
    repositories {
        google()  // com.google.ai.edge.litert, androidx, material
        mavenCentral()
    }
}

rootProject.name = "keras-attn-android-demo"
include(":core", ":app")
