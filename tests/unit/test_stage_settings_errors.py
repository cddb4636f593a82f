"""A bad CLIPSTREAM_* value stops a stage at once with the setting's name, not a traceback."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from clipstream.cli import main


@pytest.mark.parametrize(("args", "env", "name"), [
    (["selector"], {"CLIPSTREAM_SELECTOR_REPLY_BUDGET_QUANTILE": "2"}, "reply_budget_quantile"),
    (["batcher", "--model", "m"], {"CLIPSTREAM_BATCHER_MAX_IN_FLIGHT": "many"}, "max_in_flight"),
    (["worker", "--model", "m"], {"CLIPSTREAM_WORKER_THREADS": "many"}, "threads"),
])
def test_bad_setting_is_named_and_exits_2(args: list[str], env: dict[str, str], name: str) -> None:
    result = CliRunner().invoke(main, args, env=env)
    assert result.exit_code == 2, result.output
    assert "error:" in result.output and name in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
