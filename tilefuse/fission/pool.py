"""Fission rules: pool operators."""
from __future__ import annotations

