"""HTTP APIs: management, the live event stream (SSE), and the OpenAI-compatible endpoints."""
