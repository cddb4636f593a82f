"""`clipstream inspect`: the registry beside what the pipeline does with it, which version
each model's batches carry, whether its workers have it loaded and where, and each app's
learnt weights (``frontend.serving`` reads each)."""

from __future__ import annotations

import json
from dataclasses import asdict

import click

from frontend.cli import _friendly, _settings
from frontend.serving import loaded_everywhere, loaded_state, serving, serving_text, weights
from registry.topic import read_view


@click.command("inspect")
@click.option("--json", "as_json", is_flag=True,
              help="the whole registry, what serves and the learnt weights, as one JSON document")
@_friendly
def inspect_registry(as_json: bool) -> None:
    """Show the registry (apps, their linked models, and models), which version each model's
    batches go to now, and each app's learnt weights."""
    settings = _settings()
    view = read_view(settings)
    now = serving(settings, view)
    said = loaded_state(settings, view)
    learnt = weights(settings, view)
    data = {
        "apps": {n: {**asdict(a), "weights": learnt[n][0] if n in learnt else None,
                     "feedbacks_learnt": learnt[n][1] if n in learnt else None} for n, a in view.apps.items()},
        "models": {
            n: {
                "version": m.version,
                "path": str(m.path),
                "location": m.location,
                "replicas": m.replicas,
                "previous_versions": list(m.previous_versions),
                "retired_versions": list(m.retired_versions),
                "backend": m.spec.backend if m.spec else None,
                "input": {"dtype": m.spec.input.dtype, "shape": list(m.spec.input.shape)} if m.spec else None,
                "error": m.spec_error,
                "group": m.group,
                "latency_objective_ms": m.latency_objective_ms,
                "max_batch_size": m.max_batch_size,
                "batch_delay_ms": m.batch_delay_ms,
                "serving": now.get(m.group or n),
                "running": said[n].why_not is None if n in said else None,
                "not_loaded": said[n].why_not if n in said else None,
                "failed_to_load": said[n].failed if n in said else None,
                "devices": said[n].devices if n in said else [],
                "loaded_replicas": said[n].replicas if n in said else None,
            }
            for n, m in view.models.items()
        },
        "groups": {n: {"version": g.version, "replicas": g.replicas, "models": [m.name for m in g.members],
                       "serving": now.get(n)}
                   for n, g in view.groups.items()},
    }
    if as_json:
        click.echo(json.dumps(data, indent=2, default=str))
        return
    if not (data["apps"] or data["models"]):  # silence would read as a failure to reach the registry
        click.echo(f"the registry (topic prefix {settings.topic_prefix!r}) holds no app or model: `clipstream apply "
                   "-f FILE`, or `clipstream deploy-model` and `clipstream register-app`, add some")
        return
    for n, a in data["apps"].items():
        shares = " weights: " + " ".join(f"{m}={w:.2f}" for m, w in a["weights"].items()) \
            + f" (from {a['feedbacks_learnt']} feedbacks)" if a["weights"] else ""
        click.echo(f"app {n}: policy={a['policy']} slo_ms={a['slo_ms']:g} models={list(a['models'])}{shares}")
    for n, m in data["models"].items():
        shape = f" input={m['input']['dtype']}{m['input']['shape']}" if m["input"] else ""
        knobs = "".join(f" {k}={m[k]:g}" for k in ("latency_objective_ms", "max_batch_size", "batch_delay_ms")
                        if m[k] is not None)
        click.echo(f"model {n}: version={m['version']} replicas={m['replicas']} backend={m['backend']}{shape}{knobs}"
                   + (f" group={m['group']}" if m["group"] else
                      serving_text(m["version"], m["replicas"], m["serving"], running=m["running"] is not False,
                                   loaded=m["loaded_replicas"] or (), failed=m["failed_to_load"] is not None))
                   + (f" device={','.join(m['devices'])}" if m["devices"] else "")
                   + (f" NOT SERVED: {m['error']}" if m["error"] else
                      f" NOT LOADED: {m['not_loaded']}" if m["not_loaded"] else
                      f" VERSION {m['version']} FAILED TO LOAD: {m['failed_to_load']}" if m["failed_to_load"] else ""))
    for n, g in data["groups"].items():
        click.echo(f"group {n}: version={g['version']} replicas={g['replicas']} models={g['models']}"
                   + serving_text(g["version"], g["replicas"], g["serving"],
                                  running=any(data["models"][m]["running"] is not False for m in g["models"]),
                                  loaded=loaded_everywhere([data["models"][m]["loaded_replicas"] for m in g["models"]])))
