"""Log-coverage evidence for retiring native log parsing (the spec's "Native Log Parser
Retirement"): a real runtime captures llama.cpp's raw log (``SKIPPY_CAPTURE_NATIVE_LOG=1``),
loads real fixture models, generates, and for every fact a log line tells an operator this
package checks that a structured event carried the same fact, comparing the figures.

Contract:

- Only these tests read log text. The regexes (``checks.py``) are evidence, never a producer:
  nothing in ``skippyctl/`` parses a log line, and no event here is derived from one.
- The loads: ``tiny.gguf`` on the CPU, the 3-part split set, and ``tiny.gguf`` again with
  ``gpu_layers=99`` on a machine without a GPU (the CPU fallback). One lane of 256 tokens each,
  so every figure is deterministic.
- Every :class:`Fact` is either carried (its event ids must carry it, with the log's figure) or a
  known gap (``gap`` says why no event carries it). A carried fact that no event carries any more
  fails its test, and so does a gap that some event now carries: both need the table updated.
  ``absent`` facts are areas llama.cpp logs nothing for on this path; a line appearing fails.
- ``docs/LOG_COVERAGE.md`` is rendered from these results (between its markers) and
  ``test_document.py`` fails when the committed table differs. To regenerate it:

      SKIPPY_WRITE_LOG_COVERAGE=1 .venv/bin/pytest tests/api/log_coverage

Figures that vary between runs (free memory, timings) or between machines (which extra buffer
types, ``CPU_REPACK`` or ``AMX``, hold some weights: a :class:`Finding`'s ``detail``) are never
rendered.

Layout: ``evidence.py`` (a run's log lines and events, what a check finds, the readers of
events), ``checks.py`` (the log line patterns and each fact's check), ``facts.py`` (the table of
facts), ``conftest.py`` (the one runtime run the tests share), ``test_facts.py`` (each fact
carried, or a known gap) and ``test_document.py`` (the rendered table in
``docs/LOG_COVERAGE.md``).
"""
