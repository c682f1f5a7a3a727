"""The reducer: a pure function from (state, event) to (state, transitions)."""
