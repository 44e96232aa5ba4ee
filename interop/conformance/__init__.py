"""The conformance kit run with felix-client 0.6.2 (a package, so its conftest does not shadow
interop/conftest.py)."""
