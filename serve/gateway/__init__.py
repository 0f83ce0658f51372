"""The gateway wing: the ingress deployment (`deployment.py`) and what only it runs, per request:
the first look at a request (`ingress`), admission by deadline, coalescing, validation, the
operators' override, idempotency, tokenization, the shadow comparison, and the colocated
topology's local arms."""
