"""Public test harness for setl and its plugin authors: scripted sources, recording sinks, faults."""
