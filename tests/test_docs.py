"""The generated operator coverage table must match the registries."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ops_doc_is_current():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_ops_doc.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr + " (run: python scripts/gen_ops_doc.py)"
