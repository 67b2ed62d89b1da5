"""Generators of synthetic flight-recorder dumps, for tests and benchmarks: not used by the analysis.

- `runahead`: small jobs with the CPU running ahead of the GPU, one NCCL stream per group and per peer pair,
  sync points, and faults that only such a model shows (a GPU that stops answering, a GPU frozen inside a
  collective, a ring over a dead link, a live snapshot). Scenarios with their right answers.
"""
