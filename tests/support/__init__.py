"""Helpers shared by the test suites: free ports, a real Prometheus."""
