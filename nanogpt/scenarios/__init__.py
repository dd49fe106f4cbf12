"""What a run does: the throughput scenario's measured loop (warmup, windows) and a
time-to-loss run (train to the target loss)."""
