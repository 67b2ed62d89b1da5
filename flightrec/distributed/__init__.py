"""Past one machine: conversion where the dumps are and an analysis whose driver holds each rank's newest
entries only (`driver`), on a Dask cluster or, with the same code, in this process (`runner`).

Dask rather than Ray: it is pure Python (a few MB, where Ray brings a C++ runtime of several hundred), its
`LocalCluster` caps each worker's memory and restarts one that exceeds it (what the simulation on one machine
needs), and the same scheduler runs on Slurm, PBS or Kubernetes through dask-jobqueue or dask-kubernetes, or
by hand with `dask scheduler` and one `dask worker` per host (docs/scale.md). Its storage layer, fsspec, is
what reads `s3://` and `gs://` (`storage`). Installed with `pip install 'flightrec[distributed]'`.
"""
