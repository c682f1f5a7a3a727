"""The engine: the worker process that owns llama.cpp, and its protocol with the host.

What the host uses of this package is the protocol (``protocol``, ``channel``) and the spawn
arguments (``options``); the supervisor that starts and watches workers is host code
(``skippyctl.runtime.engine_supervisor``)."""
