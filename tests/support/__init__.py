"""Shared helpers for the FlexInfer test-suite (servers, databases)."""
