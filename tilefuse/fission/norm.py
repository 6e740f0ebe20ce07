"""Fission rules: norm operators."""
from __future__ import annotations

