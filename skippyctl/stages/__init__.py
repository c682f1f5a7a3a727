"""Stage workers: ggml RPC servers that an engine splits a model across.

A stage is llama.cpp's own RPC server (``ggml_backend_rpc_start_server``, bound through
skippyctl.native.rpc), run in a process of its own because the call blocks forever and executes
whatever graph a client sends. ``stage_supervisor`` starts that process (``python -m
skippyctl.stages.stage_worker``), reserves its port, probes it until it accepts connections, and
turns its lifecycle into ``stage_*`` events; ``ports`` holds the socket helpers (reservation, probe,
listener ownership); ``probe`` speaks ggml's RPC HELLO and GET_DEVICE_MEMORY in plain Python (so
the runtime host can check a stage without ggml, whose client aborts the process); ``plan`` parses
stage endpoints and splits a model's layers across stages; ``relay`` is a FIFO TCP relay with a
delay/jitter/stall wire model (``stage relay``), pure Python, for slow links on one machine.
This package sits at the level of ``skippyctl.engine``: it imports only ``native`` and
``events`` (never runtime, api, cli, or any UI framework).
"""
