"""Seeing the cluster: Prometheus metrics, the dashboard and its JSON API, simulation reports.

Reads the engine; the engine never imports this package.
"""
