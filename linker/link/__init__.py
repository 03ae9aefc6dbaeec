"""link wing."""
