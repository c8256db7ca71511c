"""Experiments: each asks one question; its README gives the question, the command and the last result."""
