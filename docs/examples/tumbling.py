from kwatermark.windows import aggregate, tumbling

totals = aggregate(events, tumbling("10 seconds"), by=["key"],
                   aggs={"n": ("count", None), "amount": ("sum", "amount")})
run(totals, "tumbling").orderBy("window_start", "key").show()
