"""The rows a micro-batch's sinks take into the driver, collected in one Spark job.

Rules:

* **A small batch's sinks read its rows in the driver**: its outputs (committed by delta-rs, see
  :mod:`spark_jobs.io.output_table`), its output topic's records and each store's changelog records (both written
  in the transaction of the batch's markers). Each read is a Spark job over the batch's cached rows, planned
  and scheduled on its own (~50-70 ms each on 2 cores for a batch of a thousand events).
* **Announced frames are read together.** The frames a batch will read are announced before the first is
  read; reading one collects it and every announced frame not read yet in **one** Spark job (each frame's rows
  a column of a union, tagged with the frame's place), and the others are then read from the driver.
* **A frame reads as its own ``toArrow`` would**: the same columns and types, the same rows in the same
  order (a union keeps its children's partitions in order, and a tag keeps each child's rows apart).
* **A batch of few input records is collected by the job that runs its plan.** Its input count is known
  before it runs (the offset log), so its frames and its rows' dead-letter reasons (the counts a batch needs
  before it writes anything) are announced together and the first read runs the plan, filling the batch's
  cache as it collects: no job of its own materialises the batch first. The persisted rows are computed once
  per partition whichever frame's task reads them first (Spark's block lock).
* A frame read that was not announced is collected with the pending ones all the same; a frame is known by
  identity (the ``DataFrame`` object announced is the one read).
"""

from __future__ import annotations

import functools

#: the union's column telling which frame a row belongs to
FRAME_COLUMN = "_driver_rows_frame"


class DriverRows:
    """One micro-batch's frames read into the driver (see the module's rules)."""

    def __init__(self) -> None:
        self._pending: list = []  # frames announced, not collected yet
        self._collected: list[tuple[object, object]] = []  # (frame, its Arrow table), collected, not read yet

    def announce(self, *frames) -> None:
        """Frames (Spark DataFrames) this batch will read with :meth:`arrow`."""
        self._pending.extend(f for f in frames if f is not None)

    def arrow(self, frame):
        """``frame``'s rows as an Arrow table (``frame.toArrow()``), collected with every pending frame."""
        for i, (collected, table) in enumerate(self._collected):
            if collected is frame:
                del self._collected[i]
                return table
        frames = [frame, *(f for f in self._pending if f is not frame)]
        self._pending.clear()
        first, *rest = collect_together(frames)
        self._collected.extend(zip(frames[1:], rest, strict=True))
        return first


def collect_together(frames: list) -> list:
    """Each of ``frames`` as an Arrow table, collected in one Spark job."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if len(frames) == 1:
        return [frames[0].toArrow()]
    # SQL text: one call into the JVM per frame (a Column per field costs several). Each frame's row is the one
    # element of an array, null in the other frames' rows: a null array has no element, so a column Spark knows
    # is never null is never null in what is read (a null struct's fields would be, and Arrow refuses them)
    tagged = [frame.selectExpr(f"{i} AS {FRAME_COLUMN}", f"array(struct(*)) AS f{i}") for i, frame in enumerate(frames)]
    union = functools.reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), tagged).toArrow()
    tags = union.column(FRAME_COLUMN)
    tables = []
    for i in range(len(frames)):
        rows = union.filter(pc.equal(tags, i)).column(f"f{i}").combine_chunks()
        if isinstance(rows, pa.ChunkedArray):  # no chunk at all: an empty frame
            rows = pa.array([], type=rows.type)
        tables.append(pa.Table.from_struct_array(rows.flatten()))
    return tables
