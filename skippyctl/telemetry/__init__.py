"""Optional telemetry consumers (Prometheus text exposition)."""
