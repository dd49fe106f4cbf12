"""Measurement probes, each small and separable: timing, memory, flops.

A probe is started and read by the training loop; it never calls back into the loop.
"""
