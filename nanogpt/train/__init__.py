"""The model behind one contract (the built-in GPT, a user's model), its data, the
optimizer it steps, its transformations (float8, FSDP2, DDP, chunked loss) and the trainer."""
