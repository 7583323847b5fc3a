"""Processes that run on worker nodes: the engine, replicas, node agents, KV transfer, benchmarks."""
