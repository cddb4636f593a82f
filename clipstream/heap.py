"""Start-up objects out of the garbage collector's way.

A stage's start-up leaves hundreds of thousands of objects that live as long as the process:
modules, classes, pydantic and Avro schemas, model sessions. CPython collects its
oldest generation when enough objects have survived the younger ones, and each such
collection walks every one of those objects, in a pause that can push a caller past its
deadline in any stage (docs/design/0011). ``gc.freeze()`` moves everything alive at that
moment into a permanent generation that collections skip; what the stage allocates while
serving is still collected as before.
"""

from __future__ import annotations

import gc


def freeze_startup_heap() -> int:
    """Collect once, then exempt every surviving object from later collections; how many."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
