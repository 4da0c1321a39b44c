from kwatermark.joins import interval_join

admin.create_topics([NewTopic("views", 1, 1)])["views"].result(30)
for second, key in [(0, "a"), (8, "b"), (11, "a"), (30, "a"), (45, "b")]:
    producer.produce("views", key=key.encode(), value=b"", timestamp=T0 + second * 1000)
    producer.flush()
views = (spark.readStream.format("kwatermark")
         .option("kafka.bootstrap.servers", bootstrap)
         .option("subscribe", "views")
         .option("startingOffsets", "earliest")
         .option("watermark.heartbeat", "true")
         .load()
         .withColumn("key", F.col("key").cast("string")))

# A click counts for a view when it comes within 5 s after the view.
joined = interval_join(views, events, on=["key"], lower="0 seconds", upper="5 seconds",
                       how="left")
(run(joined, "joined")
 .select("key", "left_event_time", "right_event_time", "right_amount", "kind")
 .orderBy("left_event_time", "right_event_time").show(truncate=False))
