"""Throughput, the scenario of every run no other asks for (scenarios/base.DEFAULT): warm up, then
time a measured window of steps (docs/measurement.md). Its faces delegate to where the code has
always been, each module at the layer of what it does (scenarios/base.py names the faces), so
this file imports none of them:

  checks.py  no keys of its own; a run keeps the point's seed (config)
  part.py    its console line: step time, tokens/s, TFLOP/s, MFU (record)
  pool.py    the runs' parts pooled (analysis/repeats.py), the step statistics and rates
             (analysis/figures.throughput_figures), speedups (analysis/compare.add_speedups)
  run.py     the measured loop's phases (scenarios/loop.run_phases)
  guard.py   the search's objectives: tokens/s, $ per 1M tokens, J per token, peak memory (tune)
  plot.py    throughput.png, mfu.png, ... (drawn by publish/plots.py)
"""
