"""Predictions joined with labels into versioned snapshots; skew and consistency monitors."""
