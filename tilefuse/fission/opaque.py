"""Fission rules: opaque operators."""
from __future__ import annotations

