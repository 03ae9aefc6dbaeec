"""plan wing."""
