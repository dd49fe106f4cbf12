"""What a run does and what its point says: a scenario a folder behind one interface (base.py: a
protocol a face, and the one picker of a run's or a point's scenario), throughput's
(throughput/: the measured loop, loop.py, warmup and windows) and time to loss's
(time_to_loss/: train to the target loss); progress.py, the bar."""
