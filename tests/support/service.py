"""What tests need to run the real service: the product's one launcher (``capwatch.demo.service``),
its one free-port helper, and the repository root (the tests' working folder)."""

from __future__ import annotations

from pathlib import Path

from capwatch.demo.ports import free_port
from capwatch.demo.service import ServiceProcess

REPO_ROOT = Path(__file__).resolve().parents[2]

__all__ = ["REPO_ROOT", "ServiceProcess", "free_port"]
