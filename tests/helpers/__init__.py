"""Helpers the tests share: small graphs, the brute-force optimum, real boards on loopback,
bad-input checks (imported as `helpers.NAME`; tests/conftest.py puts tests/ on the path)."""
