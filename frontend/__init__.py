"""frontend stage of clipstream: the REST gateway and the Python client (see README.md)."""
