"""The status page's static files (served by setl.observe.server)."""
