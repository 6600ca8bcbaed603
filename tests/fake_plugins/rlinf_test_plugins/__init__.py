"""Plugins that exist only for tests: installed by putting tests/fake_plugins on PYTHONPATH
(see tests/plugin_fixtures.py, which also writes their dist-info with the entry points)."""
