"""Pytest fixtures that start real servers (MariaDB, PostgreSQL, ZooKeeper) in temp dirs."""
