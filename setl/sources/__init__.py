"""Sources: each module implements the Select contract for one kind of log."""
