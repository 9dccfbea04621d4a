"""Operations: settings from the environment, structured logs, Prometheus metrics,
OpenTelemetry context, secrets kept out of output, the gateway's API keys. Used by every layer
above the wire; imports only the wire and :mod:`agentstream.errors`.
"""
