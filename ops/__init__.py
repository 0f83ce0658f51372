"""Operator tools: the `rollout` CLI, scripts and configuration for running the gateway."""
