"""Workload wrappers, saturation, attribution and reports (floor 3)."""
