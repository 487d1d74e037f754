"""The terminal UI: the Textual app, its screens and widgets (the only package that imports textual)."""
