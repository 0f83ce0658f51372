"""Operator tools: the `rollout` CLI (ops.cli), the incident drills (ops.drill), the offline
regression gate (ops.verify), the benchmarks (ops.bench), the load-generation library and load
test (ops.load), the generators of shipped files (ops.generate), scripts and configuration for
running the gateway.
"""
