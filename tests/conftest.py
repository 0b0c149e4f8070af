pytest_plugins = ["setl.testing.fixtures"]
