"""Findings of the stop-46 new-user review (docs/bad_inputs.md §27)."""
from __future__ import annotations
