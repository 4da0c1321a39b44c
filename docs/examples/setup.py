import os
import sys
import tempfile

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # Spark's workers run this Python

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from kwatermark.localbroker import LocalBroker

broker = LocalBroker.start()          # a throwaway broker; or use your own "host:9092"
bootstrap, topic = broker.bootstrap_servers, "clicks"
admin = AdminClient({"bootstrap.servers": bootstrap})
admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)

T0 = 1_700_000_000_000                # 2023-11-14 22:13:20 UTC, in epoch ms
producer = Producer({"bootstrap.servers": bootstrap})


def send(partition, second, key, amount):
    producer.produce(topic, partition=partition, key=key, value=str(amount).encode(),
                     timestamp=T0 + round(second * 1000))
    producer.flush()                  # the bundled broker wants each partition's last
                                      # record in a batch of its own


clicks = [  # (partition, second, key, amount): partition 1 runs about 5 s behind
    (0, 1, "a", 3), (0, 2, "a", 5), (0, 9, "b", 1), (0, 12, "a", 2), (0, 31, "a", 7),
    (0, 40, "b", 1), (1, -4, "b", 4), (1, 3, "b", 2), (1, 7, "a", 1), (1, 26, "b", 5),
    (1, 35, "a", 1)]
for click in clicks:
    send(*click)

spark = (SparkSession.builder.master("local[2]")
         .config("spark.sql.shuffle.partitions", "2")   # Spark's 200 make stateful batches slow
         .config("spark.sql.session.timeZone", "UTC")
         .config("spark.ui.showConsoleProgress", "false")
         .getOrCreate())
events = (spark.readStream.format("kwatermark")
          .option("kafka.bootstrap.servers", bootstrap)
          .option("subscribe", topic)
          .option("startingOffsets", "earliest")
          .option("watermark.heartbeat", "true")        # kwatermark.windows needs it
          .load()
          .withColumn("key", F.col("key").cast("string"))
          .withColumn("amount", F.col("value").cast("string").cast("int")))


def run(frame, name):
    """Run a windowed stream over what the topic holds now; return its rows as a table."""
    query = (frame.writeStream.outputMode("append").format("memory").queryName(name)
             .option("checkpointLocation", tempfile.mkdtemp())
             .trigger(availableNow=True).start())
    query.awaitTermination()
    return spark.table(name)
