"""The dashboard's screens: the main dashboard, help, and the load/unload model dialogs."""
