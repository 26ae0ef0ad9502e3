"""spark_tasks package of chronoq (see README)."""
