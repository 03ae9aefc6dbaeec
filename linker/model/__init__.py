"""model wing."""
