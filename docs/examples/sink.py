import sqlite3

from kwatermark.windows import aggregate, tumbling

counts = aggregate(events, tumbling("10 seconds"), by=["key"], aggs={"n": ("count", None)},
                   allowed_lateness="10 seconds")

db = sqlite3.connect(os.path.join(tempfile.mkdtemp(), "clicks.db"), check_same_thread=False)
db.executescript("""
    CREATE TABLE counts (key TEXT, window_start TEXT, base INTEGER NOT NULL DEFAULT 0,
                         late INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (key, window_start));
    CREATE TABLE progress (query TEXT PRIMARY KEY, batch_id INTEGER NOT NULL);""")


def upsert(batch, batch_id):
    with db:                                    # one transaction: rows and batch id together
        done = db.execute("SELECT batch_id FROM progress WHERE query = 'counts'").fetchone()
        if done and batch_id <= done[0]:
            return                              # a batch replayed after a restart: applied
        for row in batch.collect():             # a key's rows in the order they were emitted
            print(batch_id, row.kind, row.key, row.window_start, row.n)
            where = (row.key, str(row.window_start))
            if row.kind == "late":              # records past the lateness: add them
                db.execute("INSERT INTO counts VALUES (?, ?, 0, ?) ON CONFLICT (key, "
                           "window_start) DO UPDATE SET late = late + excluded.late",
                           (*where, row.n))
            else:                               # final or update: the whole window again
                db.execute("INSERT INTO counts VALUES (?, ?, ?, 0) ON CONFLICT (key, "
                           "window_start) DO UPDATE SET base = excluded.base",
                           (*where, row.n))
        db.execute("INSERT INTO progress VALUES ('counts', ?) ON CONFLICT (query) "
                   "DO UPDATE SET batch_id = excluded.batch_id", (batch_id,))


checkpoint = tempfile.mkdtemp()


def run_sink():
    query = (counts.writeStream.outputMode("append").foreachBatch(upsert)
             .option("checkpointLocation", checkpoint)  # state and progress live here
             .trigger(availableNow=True).start())
    query.awaitTermination()


run_sink()
