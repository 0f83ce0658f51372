"""The Ray Serve application: gateway, model deployments, variants.

Importing this package is cheap; `serve.config` (which imports Ray) is what `serve run` loads.
"""
