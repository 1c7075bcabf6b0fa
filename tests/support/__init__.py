"""Helpers the tests import by name (``from support.tiny_kernel import policy_kernel``): plain
functions, classes and constants shared by more than one test file. tests/ is on ``sys.path``
(``pythonpath`` in pyproject.toml; bench/ scripts insert it themselves), so a test in any
folder under tests/ imports them the same way. Fixtures are not imported by name: they live in
tests/conftest.py and the plugin modules it names in ``pytest_plugins``."""
