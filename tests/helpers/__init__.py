"""Helpers the tests share (never test modules themselves)."""
