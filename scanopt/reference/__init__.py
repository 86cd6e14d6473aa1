"""Embedded reference executor."""
