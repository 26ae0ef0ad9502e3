"""Hosts as network namespaces with faults between them (issue 19 §1): run with
``.venv/bin/pytest -m slow tests/netns``."""
