"""The record's logic: result.json and steps.csv written and read back, a point's
figures derived once, runs pooled, statistics and verdicts, the sweep's table and its
comparisons."""
