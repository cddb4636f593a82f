"""What the selector's loops share: the apps' policies, and its logger."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from clipstream.errors import ConfigError
from selector.outputs import AppOutputs, app_outputs
from selector.policies import SelectionPolicy, get_policy

log = logging.getLogger("selector")


class Apps:
    """The policy object and output kind of each app, rebuilt only when its config changes."""

    def __init__(self, view: Callable[[], Any]) -> None:
        self.view = view
        self._cache: dict[str, tuple[Any, SelectionPolicy, AppOutputs]] = {}
        self._lock = threading.Lock()

    def get(self, name: str) -> tuple[Any, SelectionPolicy, AppOutputs]:
        """(AppConfig, policy, outputs); ConfigError when the app is unknown or misconfigured."""
        view = self.view()
        app = view.apps.get(name)
        if app is None:
            raise ConfigError(f"unknown app {name!r}")
        if not app.models:
            raise ConfigError(f"app {name!r} has no linked models")
        outputs = app_outputs(view, app.models)
        signature = (app, outputs)
        with self._lock:
            hit = self._cache.get(name)
            if hit is not None and hit[0] == signature:
                return app, hit[1], outputs
            config = dict(app.policy_config, kind=outputs.kind, labels=list(outputs.labels or ()))
            policy = get_policy(app.policy, config)
            self._cache[name] = (signature, policy, outputs)
            return app, policy, outputs
