"""Fission rules: conv operators."""
from __future__ import annotations

