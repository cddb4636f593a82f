"""Reasons a Response carries for a default answer that another stage acts upon.

The selector writes them and the gateway reads them: a default because nothing arrived in time,
or because every request expired in a batcher's queue, means the pipeline is behind, so the
gateway admits fewer queries. They live here, with the records both sides share, rather than
in either stage.
"""

NOTHING_ARRIVED = "no prediction arrived by the deadline"
# the selector asked no model: by their recent trips, none could answer in time
NO_TIME_TO_ASK = "too little time left to ask any model"
# a batcher's error for a request whose deadline passed while it waited in the queue
QUEUED_PAST_DEADLINE = "deadline passed while queued in the batcher"
# every chosen model's request expired in its batcher's queue (or was not asked for lack of time)
EXPIRED_IN_QUEUE = "every model's request expired in its batcher's queue"
# defaults that say the pipeline is behind
BEHIND = frozenset({NOTHING_ARRIVED, NO_TIME_TO_ASK, EXPIRED_IN_QUEUE})
