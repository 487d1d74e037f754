"""Plain-Python core of gpuanat: knows no UI and no torch (tests/test_import_hygiene.py checks)."""
