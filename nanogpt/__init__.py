"""nanogpt-sweep: measured GPT training for every point of a Hydra sweep."""
