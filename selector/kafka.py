"""What the selector's loops share: the apps' policies, and its logger."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

from clipstream.errors import ConfigError
from selector.outputs import AppOutputs, app_outputs
from selector.policies import SelectionPolicy, get_policy

log = logging.getLogger("selector")


class Apps:
    """The policy object and output kind of each app, rebuilt only when its config changes.

    The registry follower publishes a new view object on every change and never mutates one,
    so an answer is reused for as long as the view is the same object: a query asks for its
    app several times (dispatch, join, answer), and each check would otherwise compare the
    app's whole config and recompute its outputs."""

    def __init__(self, view: Callable[[], Any], allowed: Iterable[str] = ()) -> None:
        self.view = view
        self.allowed = tuple(allowed)  # policy import paths the operator allows besides the built-ins
        self._cache: dict[str, tuple[Any, SelectionPolicy, AppOutputs]] = {}
        self._seen: dict[str, tuple[Any, tuple[Any, SelectionPolicy, AppOutputs]]] = {}  # name -> (view, answer)
        self._versions: dict[str, tuple[Any, dict[str, str | None]]] = {}  # name -> (view, its models' versions)
        self._lock = threading.Lock()

    def versions(self, name: str) -> dict[str, str | None]:
        """The version the registry serves of each of the app's models (worked out once per view)."""
        view = self.view()
        hit = self._versions.get(name)
        if hit is not None and hit[0] is view:
            return hit[1]
        app = view.apps.get(name)
        found = {m: getattr(view.models.get(m), "version", None) for m in (app.models if app else ())}
        self._versions[name] = (view, found)
        return found

    def get(self, name: str) -> tuple[Any, SelectionPolicy, AppOutputs]:
        """(AppConfig, policy, outputs); ConfigError when the app is unknown or misconfigured."""
        view = self.view()
        seen = self._seen.get(name)
        if seen is not None and seen[0] is view:
            return _or_refusal(seen[1])
        app = view.apps.get(name)
        if app is None:
            raise ConfigError(f"unknown app {name!r}")
        if not app.models:
            raise ConfigError(f"app {name!r} has no linked models: link one (clipstream link {name} MODEL)")
        outputs = app_outputs(view, app.models)
        signature = (app, outputs)
        with self._lock:
            hit = self._cache.get(name)
            if hit is not None and hit[0] == signature:
                answer = (app, hit[1], outputs)
            else:
                config = dict(app.policy_config, kind=outputs.kind, labels=list(outputs.labels or ()))
                try:
                    policy = get_policy(app.policy, config, self.allowed)
                except ConfigError as exc:  # refused or broken: remembered until the record changes
                    policy = exc  # type: ignore[assignment]
                except Exception as exc:  # a policy's constructor failing on the record's config
                    policy = ConfigError(f"policy {app.policy!r} could not be built: {type(exc).__name__}: {exc}")  # type: ignore[assignment]
                self._cache[name] = (signature, policy, outputs)
                answer = (app, policy, outputs)
            self._seen[name] = (view, answer)
            return _or_refusal(answer)


def _or_refusal(answer: tuple[Any, Any, AppOutputs]) -> tuple[Any, SelectionPolicy, AppOutputs]:
    """The answer, or the ConfigError that refused the app's policy, raised again."""
    if isinstance(answer[1], ConfigError):
        raise answer[1]
    return answer
