"""The gateway's and the model replicas' telemetry, adapting rollout.telemetry to OpenTelemetry,
Prometheus and Ray: the providers, exporters and sinks (otel), one request's spans, metrics,
window record and log line (observe), the instruments (instruments), trace context across
processes and the model replica's spans (tracing), and each gateway replica's own Prometheus
port, registered in Redis for service discovery (metrics_targets).

Importing this package is cheap; each module imports OpenTelemetry when it is imported.
"""
