"""Serving plugins: the plugin ABI's Python side, the sidecar that runs a plugin in its own
process, and the engine's link to the sidecars (``link.PluginLink``).

A bottom layer: it imports only the standard library (and may import ``skippyctl.events``);
the engine imports it. Token ids cross into plugin processes only, never into reports,
counters, logs or exceptions.
"""
