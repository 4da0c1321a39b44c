from kwatermark.dedup import drop_duplicates

send(0, 12.2, "a", 2)     # a retrying client sends the click at 12 s again, 200 ms later

unique = drop_duplicates(events, ["key", "amount"], within="1 second")
(run(unique, "unique").select("key", "amount", "partition", "event_time", "kind")
 .orderBy("event_time").show(truncate=False))
