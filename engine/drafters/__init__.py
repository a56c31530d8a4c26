"""Drafters: one family per module, all behind the interface in `base.py`."""
