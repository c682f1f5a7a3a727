"""Configuration, each concept in one shape (ARCHITECTURE.md §3): what a load asks for
(``load_options``) and what a runtime is started with (``runtime_settings``). Every layer that
carries one of them — the CLI, the API schema, the client, the host, the engine protocol, the
state document — uses these types instead of restating their fields."""
