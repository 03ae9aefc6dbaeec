"""write wing."""
