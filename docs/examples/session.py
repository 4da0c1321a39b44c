from kwatermark.windows import aggregate, session

visits = aggregate(events, session("5 seconds"), by=["key"],
                   aggs={"n": ("count", None), "first": ("first", "amount"),
                         "last": ("last", "amount")})
run(visits, "session").orderBy("key", "window_start").show()
