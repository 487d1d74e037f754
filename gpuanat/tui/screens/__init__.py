"""Screens pushed over the dashboard: history, compare, confirmations."""
