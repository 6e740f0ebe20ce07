"""Fission rules: indirect operators."""
from __future__ import annotations

