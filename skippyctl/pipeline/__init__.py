"""The pipeline: adapt native facts, reconcile with authority, reduce, dispatch."""
