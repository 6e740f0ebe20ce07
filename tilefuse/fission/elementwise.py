"""Fission rules: elementwise operators."""
from __future__ import annotations

