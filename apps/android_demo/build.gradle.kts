// Versions are pinned here and stated in README.md (Android Gradle plugin 8.13.2 needs
// Gradle >= 8.13 and JDK 17).
plugins {
    id("com.android.application") version "8.13.2" apply false
    id("org.jetbrains.kotlin.android") version "2.2.21" apply false
    id("org.jetbrains.kotlin.jvm") version "2.2.21" apply false
}
