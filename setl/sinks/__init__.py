"""Targets: each module implements the Load contract for one kind of target."""
