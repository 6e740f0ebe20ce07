"""Fission rules: attention operators."""
from __future__ import annotations

