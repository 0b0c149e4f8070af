"""Developer tools: dev servers, the demo, load generators (importable as ``tools.sysbench``), benchmarks."""
