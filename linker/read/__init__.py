"""read wing."""
