"""Fission rules: layout operators."""
from __future__ import annotations

