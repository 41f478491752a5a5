"""The operator's dashboard: pages (``views``), their reads (``selectors``), URLs by name, and the
live feed (``live``, ``consumers``, ``routing``)."""
