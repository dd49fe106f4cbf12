"""What leaves the sweep dir's own files: plots, W&B runs and view, the search's answer,
and the one sequence that publishes a sweep."""
