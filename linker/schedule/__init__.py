"""schedule wing."""
