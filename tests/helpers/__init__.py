"""Shared test helpers: tiny models and pairs, synthetic profiles and labels, verifier cases.

Test modules import from here, never from each other.
"""
