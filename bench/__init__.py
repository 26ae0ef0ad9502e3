"""Load scripts that print figures (``python bench/timer_load.py --help``)."""
