"""Operator tools: the `rollout` CLI (ops.cli), the incident drills (ops.drill), the offline
regression gate (ops.verify), the benchmark (ops.bench), scripts and configuration for running
the gateway."""
