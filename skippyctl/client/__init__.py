"""Client side of the runtime API: launch-or-attach, HTTP calls, the live event stream."""
