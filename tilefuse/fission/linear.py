"""Fission rules: linear operators."""
from __future__ import annotations

