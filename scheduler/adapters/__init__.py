"""Adapters: the only modules that talk to servers and databases (see the import contracts in
pyproject.toml). ``store`` keeps job requests, units, attempts and the accounting log."""
