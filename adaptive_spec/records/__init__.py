"""Producing the selector's data: ``collect`` runs the engine and writes feature logs; ``label``
turns a log into a label table (expected block efficiency and predicted step time of every action).

The formats themselves (feature schema, feature log, label table) live in :mod:`adaptive_spec.formats`.
"""
