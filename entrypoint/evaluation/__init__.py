"""Measuring models, the same way every time: one procedure (inputs, decoding, metrics, the eval config
that records them), classification metrics, format and extraction metrics, guardrails and the verdict,
greedy generation, the sealed test split, and the fresh-process verification before export.
"""
