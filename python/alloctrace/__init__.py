"""alloctrace (in progress)."""
