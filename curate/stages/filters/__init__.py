"""Heuristic filters: metrics as columns, rules as named reject conditions."""
