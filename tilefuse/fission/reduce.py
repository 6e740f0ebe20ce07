"""Fission rules: reduce operators."""
from __future__ import annotations

