"""Reusable widgets: each module holds one widget and styles itself from the theme."""
