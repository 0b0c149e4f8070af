"""Public test helpers for setl and its plugin authors: scripted sources, recording sinks and faults
(`harness`), transforms on a local Spark (`spark`), and the connector contract suites (`connectors`)."""
