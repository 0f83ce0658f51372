"""What the gateway and the model replicas both use, imported downward by each: the domain
errors, the answers that cross the hop between them, token-budgeted batches, regression sets and
exact nearest neighbours."""
