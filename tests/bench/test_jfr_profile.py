"""bench/jfr_profile.py's attribution (pure): a sample is its innermost known part's, not its callers'."""

from __future__ import annotations

from bench.jfr_profile import OTHER, part_of

CACHE_BUILDER = "org.apache.spark.sql.execution.columnar.DefaultCachedBatchSerializer$$anon$1.next"
STAGE = "org.apache.spark.sql.catalyst.expressions.GeneratedClass$GeneratedIteratorForCodegenStage3.processNext"


def test_the_processor_under_the_cache_builder_is_the_processors():
    frames = [  # innermost first, as the recorder lists them
        "java.util.HashMap.get",
        "streamstate.primitives.StreamTableJoin$Joiner$Batch.versionsOf",
        "streamstate.primitives.StreamTableJoin$Joiner.handlePartitionRows",
        STAGE,
        CACHE_BUILDER,
        "java.lang.Thread.run",
    ]
    assert part_of(frames) == "the platform's processors (streamstate.*)"


def test_generated_code_is_named_by_what_its_stage_feeds():
    assert part_of(["org.apache.spark.unsafe.Platform.copyMemory", STAGE, CACHE_BUILDER]).endswith(
        "feeding the batch cache"
    )
    shuffle = "org.apache.spark.shuffle.sort.BypassMergeSortShuffleWriter.write"
    assert part_of([STAGE, shuffle]).endswith("feeding a shuffle")


def test_an_owner_takes_everything_under_it_and_unknown_frames_are_other():
    making_a_handle = [
        "org.apache.spark.sql.catalyst.encoders.ExpressionEncoder.resolveAndBind",
        "org.apache.spark.sql.execution.streaming.StatefulProcessorHandleImpl.getMapState",
        "streamstate.primitives.StreamTableJoin$Joiner.init",
    ]
    assert part_of(making_a_handle).startswith("state handles made per task")
    assert part_of(["java.io.ObjectInputStream.readObject", "java.lang.Thread.run"]) == OTHER
