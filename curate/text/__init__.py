"""Columnar text helpers shared by cleaning, filters and scores: word tokens, lines, repetition kernels."""
