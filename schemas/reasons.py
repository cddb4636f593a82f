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
# defaults that say the pipeline is behind
BEHIND = frozenset({NOTHING_ARRIVED, NO_TIME_TO_ASK, EXPIRED_ON_ARRIVAL})

# a batcher's refusal of a request's input (``Prediction.error``), then ``<model>: <why>``: the
# caller's mistake, which the selector neither counts as the model's failure nor repeats per model
BAD_INPUT = "bad input for model "

# ``Prediction.status`` values that carry the model's output (a worker's, or the batcher's cache)
OK_STATUSES = frozenset({"ok", "cached"})
