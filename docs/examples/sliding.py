from kwatermark.windows import aggregate, sliding

moving = aggregate(events, sliding("20 seconds", "10 seconds"), by=["key"],
                   aggs={"n": ("count", None), "biggest": ("max", "amount")})
run(moving, "sliding").orderBy("window_start", "key").show()
