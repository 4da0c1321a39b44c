"""JVM options for the tests' own Spark JVMs. Benchmarks against ``format("kafka")`` keep
the default JIT (they measure steady-state speed); bench_cluster uses these, as its cluster does.

The tests' JVMs live for seconds to minutes: the C1 compiler alone and a single-threaded
collector spend less of CI's two cores on warm-up. Measured on two files each, same machine,
rotated order: test_joins + test_restart 506/451 -> 345/384 CPU s (wall 311/282 -> 238/267 s),
test_windows 770 -> 632 CPU s (482 -> 431 s)."""

TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

# For a local-mode SparkSession (its executors run in the driver's JVM).
TEST_SPARK_CONF = {"spark.driver.extraJavaOptions": TEST_JVM_OPTIONS}
