"""The control plane: the ramp controller deployment (`deployment.py`), its HTTP checks, and
where notifications come from and how webhooks deliver them."""
