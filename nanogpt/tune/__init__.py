"""The search's plain logic (hydra/sweeper=tune, docs/tune.md): what each objective reads
from a record (objectives), which candidates fit before they run (fit), which advance from
one rung to the next and which one wins (ladder), whether a leader trains as well as the
baseline (quality), a job dir per candidate (jobs). Its Hydra and Optuna face is
frontend/tune_sweeper.py and frontend/tune_space.py; its answer's files and plot,
publish/tune_answer.py and publish/tune_plot.py."""
