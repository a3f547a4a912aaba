#!/usr/bin/env bash
# Installs what the Kafka driver's tests and benchmarks need on Debian 12: Java 17 (the broker's
# runtime), Maven (to fetch the broker) and librdkafka-dev (the driver's client library), then
# copies Apache Kafka 4.1.1 (org.apache.kafka:kafka_2.13 with its runtime dependencies, the
# kafka-tools jar for ProducerPerformance/ConsumerPerformance and a log4j2 binding so the broker's
# log is readable) from Maven Central into $kafka_libs, where tests/testing/kafka_server.h finds
# them. Idempotent: returns at once when everything is present.
set -euo pipefail
here=$(dirname "$0")
kafka_version=4.1.1
log4j_version=2.24.3
kafka_libs=${BUS_KAFKA_LIBS:-/usr/local/lib/bus-kafka/libs}

bash "$here/apt_install.sh" setup_kafka openjdk-17-jre-headless maven librdkafka-dev

stamp="$kafka_libs/.kafka-$kafka_version"
[ -f "$stamp" ] && exit 0

sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
echo "setup_kafka: copying kafka_2.13 $kafka_version and its dependencies into $kafka_libs"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.bus</groupId>
  <artifactId>kafka-libs</artifactId>
  <version>1</version>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_2.13</artifactId>
      <version>$kafka_version</version>
    </dependency>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka-tools</artifactId>
      <version>$kafka_version</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-slf4j-impl</artifactId>
      <version>$log4j_version</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-core</artifactId>
      <version>$log4j_version</version>
    </dependency>
  </dependencies>
</project>
POM
mvn -q -B -f "$work/pom.xml" dependency:copy-dependencies -DincludeScope=runtime \
  -DoutputDirectory="$work/libs"
"${sudo_cmd[@]}" mkdir -p "$kafka_libs"
"${sudo_cmd[@]}" cp "$work"/libs/*.jar "$kafka_libs/"
"${sudo_cmd[@]}" touch "$stamp"
