"""Helpers shared by tests (imported by test modules; never a test module itself)."""
