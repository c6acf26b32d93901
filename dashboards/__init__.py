"""Grafana dashboards and Prometheus rules for capwatch, generated as code and checked against a real Prometheus.

``python -m capwatch.dashboards.generate`` writes ``dashboards/grafana/*.json``; the rules live in ``dashboards/rules/``.
"""
