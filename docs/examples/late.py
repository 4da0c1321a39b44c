send(1, 27, "b", 1)    # the watermark is at 34.999 s: [20 s, 30 s) closed, within lateness
send(1, 8, "a", 1)     # [0 s, 10 s) closed more than 10 s ago: a late row
send(0, 50, "a", 1)    # both partitions move on, the watermark to 44.999 s
send(1, 45, "b", 1)
run_sink()
for row in db.execute("SELECT key, window_start, base, late, base + late AS n "
                      "FROM counts ORDER BY window_start, key"):
    print(row)
