"""The model replica wing: the model deployment (`deployment.py`, one arm behind dynamic
batching) and what only it runs, per model: the cost of a batch, threads that follow the share,
memory given back after a burst, and the faults a test may inject."""
