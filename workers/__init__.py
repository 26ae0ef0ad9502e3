"""workers package of chronoq (see README)."""
