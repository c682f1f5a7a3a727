"""The serving plugins that ship with skippyctl, written against ``skippyctl.plugins.api`` like
any third-party plugin and registered as entry points of the group ``skippyctl.plugins``
(pyproject.toml). ``--spec ngram`` runs the n-gram one in the engine process instead
(``skippyctl.plugins.inprocess``)."""
