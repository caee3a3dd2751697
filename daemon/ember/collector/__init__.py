"""``ember collector``: receives profiles, stores them, answers queries and
serves the web UI."""
