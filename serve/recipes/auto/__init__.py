"""`auto`: the recipe picked by measurement (`choose.py`) and the measurement itself
(`trial.py`)."""
