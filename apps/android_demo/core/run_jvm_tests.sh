#!/usr/bin/env bash
# Compiles the Kotlin core and its JUnit tests with kotlinc (no Gradle, no Android) and runs
# them; the parity test compares Kotlin with Python on every golden vector.
#
#   apps/android_demo/core/run_jvm_tests.sh [GOLDEN_ROOT]
#
# Without GOLDEN_ROOT, fresh golden vectors are written first by
# apps/android_demo/tools/make_golden_vectors.py (tiny random-weight models, ~1 minute).
# Needs kotlinc (Debian: apt-get install -y kotlin junit4), JUnit 4 and hamcrest-core jars
# (JUNIT_JAR / HAMCREST_JAR override /usr/share/java), and for the generator the project's
# Python (PYTHON, default .venv/bin/python of the repository). Exits non-zero on any failure.
set -euo pipefail

CORE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$CORE/../../.." && pwd)"
PYTHON="${PYTHON:-$REPO/.venv/bin/python}"
JUNIT_JAR="${JUNIT_JAR:-/usr/share/java/junit4.jar}"
HAMCREST_JAR="${HAMCREST_JAR:-/usr/share/java/hamcrest-core.jar}"
KOTLINC="${KOTLINC:-kotlinc}"

for tool in "$KOTLINC" java; do
    command -v "$tool" >/dev/null || { echo "error: $tool not found (apt-get install -y kotlin junit4)" >&2; exit 2; }
done
for jar in "$JUNIT_JAR" "$HAMCREST_JAR"; do
    [ -f "$jar" ] || { echo "error: $jar not found (apt-get install -y junit4, or set JUNIT_JAR / HAMCREST_JAR)" >&2; exit 2; }
done

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
started=$(date +%s)

GOLDEN="${1:-}"
if [ -z "$GOLDEN" ]; then
    GOLDEN="$WORK/golden"
    echo "== golden vectors -> $GOLDEN"
    (cd "$REPO" && "$PYTHON" apps/android_demo/tools/make_golden_vectors.py "$GOLDEN")
fi
[ -d "$GOLDEN" ] || { echo "error: golden root $GOLDEN is not a directory" >&2; exit 2; }

# The Kotlin runtime of the compiler that builds the classes.
KOTLIN_HOME="${KOTLIN_HOME:-$(dirname "$(dirname "$(readlink -f "$(command -v "$KOTLINC")")")")}"
STDLIB="$(ls "$KOTLIN_HOME"/lib/kotlin-stdlib.jar /usr/share/java/kotlin-stdlib.jar 2>/dev/null | head -n 1 || true)"
[ -n "$STDLIB" ] || { echo "error: kotlin-stdlib.jar not found (set KOTLIN_HOME)" >&2; exit 2; }

echo "== kotlinc $("$KOTLINC" -version 2>&1 | grep -o 'kotlinc-jvm [0-9.]*' || true): core + tests"
"$KOTLINC" -nowarn "$CORE/src/main/kotlin" "$CORE/src/test/kotlin" \
    -cp "$JUNIT_JAR:$HAMCREST_JAR" -d "$WORK/classes" 2>&1 | grep -v -E "^(OpenJDK .*warning|warning: unable to find kotlin-stdlib)" || true
[ -f "$WORK/classes/dev/kerasattn/core/WordPieceTokenizer.class" ] || { echo "error: compilation failed" >&2; exit 1; }

# The BERT text tables resource: the Python library's file, copied as Gradle's processResources does.
mkdir -p "$WORK/resources/dev/kerasattn/core"
cp "$REPO/keras_attn/text/bert_text_tables.txt" "$WORK/resources/dev/kerasattn/core/"

TESTS=$(cd "$CORE/src/test/kotlin" && find . -name '*Test.kt' | sed -e 's|^\./||' -e 's|\.kt$||' -e 's|/|.|g' | sort)
echo "== JUnit: $(echo $TESTS | wc -w) test classes"
java -Dgolden.root="$GOLDEN" \
    -cp "$WORK/classes:$WORK/resources:$STDLIB:$JUNIT_JAR:$HAMCREST_JAR" \
    org.junit.runner.JUnitCore $TESTS
echo "== done in $(( $(date +%s) - started )) s"
