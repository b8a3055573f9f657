"""Tensor parallelism: process groups, sharding plans, sharded layers, worker processes.

One model split over K processes (one GPU each; gloo on the CPU). Rank 0 owns the scheduler, reader,
writer and checkpoints and drives the others through a control channel (one connection per worker); every rank
runs the same runner (streams, slots, graphs) over its own shard of the weights.
"""
