"""Commands that orchestrate several layers (``generate`` with a selector, the selector pipeline).

They sit above every library package and below :mod:`adaptive_spec.cli`, whose dispatch table
maps command paths to them.
"""
