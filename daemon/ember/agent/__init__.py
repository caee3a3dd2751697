"""``ember agent``: continuous profiling of a host, shipped to backends."""
