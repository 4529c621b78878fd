"""OpenTelemetry GenAI ingestion: OTLP/HTTP trace exports become obs.inference_log rows."""
