"""Observability: metrics, progress, the phase tracker."""
