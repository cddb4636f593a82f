"""Every error the stages raise on purpose is a ClipstreamError.

A stage's catch-all for bad input (``except ClipstreamError``) and a user's ``except`` around
the client rely on one base class; an exception class outside it would slip past both."""

from __future__ import annotations

import ast
from pathlib import Path

import clipstream.errors
import frontend.gateway_http
import frontend.gateway_kafka
import topics.emitter

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("clipstream", "frontend", "selector", "batchers", "workers", "registry", "topics", "schemas")


def _exception_classes() -> list[tuple[str, str, list[str]]]:
    """(file, class, bases) of every class in the stages' packages whose base names an error."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ClassDef):
                    bases = [ast.unparse(b) for b in node.bases]
                    if any(b.endswith(("Error", "Exception", "Problem", "Failed", "Overloaded")) for b in bases):
                        found.append((str(path.relative_to(ROOT)), node.name, bases))
    return found


def test_every_exception_class_of_the_stages_derives_from_the_project_base() -> None:
    classes = _exception_classes()
    assert len(classes) >= 10, classes  # the scan found the hierarchy itself, not an empty tree
    outside = [(f, name, bases) for f, name, bases in classes
               if f != "clipstream/errors.py" or name != "ClipstreamError"
               if any(b in ("Exception", "BaseException", "RuntimeError", "ValueError") for b in bases)]
    assert outside == []


def test_the_gateway_and_emitter_errors_are_caught_by_the_base() -> None:
    for cls in (frontend.gateway_http.HTTPProblem, frontend.gateway_kafka.Overloaded, topics.emitter.DeliveryFailed):
        assert issubclass(cls, clipstream.errors.ClipstreamError), cls
