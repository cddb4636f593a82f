"""Reasons a Response carries for a default answer that another stage acts upon, and the
prediction statuses that carry an answer.

The selector writes them, the gateway reads them (a default because nothing arrived in time
means the pipeline is behind: the gateway admits fewer queries), so they live here, with the
records both sides share, rather than in either stage.
"""

NOTHING_ARRIVED = "no prediction arrived by the deadline"
# the selector asked no model: by their recent trips, none could answer in time
NO_TIME_TO_ASK = "too little time left to ask any model"
# the query was out of time when the selector read it: no model was asked, as it queued too long
EXPIRED_ON_ARRIVAL = "the deadline had passed before the query reached the selector"
# then ``<model>: <why>`` per model: each model asked was given up by its batcher, queued past
# the deadline or too slow for the time left. Late, not broken: capacity, not a rollback, helps
MODELS_LATE = "every model was late: "
# then ``<model>: <error>`` per model: at least one model asked answered with an error
MODELS_FAILED = "every model failed: "
# defaults that say the pipeline is behind
BEHIND = frozenset({NOTHING_ARRIVED, NO_TIME_TO_ASK, EXPIRED_ON_ARRIVAL})


def behind(reason: str | None) -> bool:
    """Whether a default's ``reason`` says the pipeline is behind (the gateway admits fewer)."""
    return reason is not None and (reason in BEHIND or reason.startswith(MODELS_LATE))

# a batcher's refusal of a request's input (``Prediction.error``), then ``<model>: <why>``: the
# caller's mistake, which the selector neither counts as the model's failure nor repeats per model
BAD_INPUT = "bad input for model "
# a worker's, for an input its model refused (``clipstream.InputError``), then ``<why>``
MODEL_BAD_INPUT = "bad input: "


def refused_input(model: str, error: str) -> str | None:
    """Why ``model``'s batcher or the model itself refused the caller's input, when its
    prediction's ``error`` says so; None for any other failure (the model's own)."""
    if error.startswith(BAD_INPUT):
        return error.removeprefix(f"{BAD_INPUT}{model}: ") if error.startswith(f"{BAD_INPUT}{model}: ") else None
    return error.removeprefix(MODEL_BAD_INPUT) if error.startswith(MODEL_BAD_INPUT) else None

# ``Prediction.status`` values that carry the model's output (a worker's, or the batcher's cache)
OK_STATUSES = frozenset({"ok", "cached"})
