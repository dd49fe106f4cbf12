"""What is measured beside the steps: timing and windows, setup counts, memory,
energy, contention, compile health, the profiler, the diagnosis, max batch."""
