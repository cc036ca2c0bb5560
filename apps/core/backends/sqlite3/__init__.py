"""SQLite with its writers queued in the process (see ``base``)."""
