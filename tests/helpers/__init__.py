"""Helpers shared by test modules (tests never import other test modules)."""
