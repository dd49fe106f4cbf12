"""Time to loss, the scenario of a run trained to a target validation loss (bench.target_loss,
docs/time_to_loss.md), all in this folder. Its modules are the faces of the scenario interface
(scenarios/base.py), each at the layer of what it does (the import contract in pyproject.toml
names each), so this file imports none of them:

  checks.py  what a time-to-loss run needs, checked without torch (config)
  part.py    the record's time_to_loss part, whether a spec or a record is this scenario's,
             the fields it shows, its console line (record)
  pool.py    a point's runs pooled, its figures, its comparison in the table (analysis)
  run.py     the run: train from the first step to the target (scenarios)
  guard.py   the search's objective and its quality guard by the target (tune)
  plot.py    val_loss.png (publish)
"""
