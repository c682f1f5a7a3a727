"""The engine: a worker process that owns llama.cpp, and the host-side supervisor."""
